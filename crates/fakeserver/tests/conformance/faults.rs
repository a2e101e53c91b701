//! Fault injection: errors at a rate with the chosen code, deterministic per seed; latency; watch events
//! delivered late; watches dropped after N events.

use std::time::Duration;

use futures::StreamExt;
use gpuop_fakeserver::{FakeServer, Faults, InjectedError, Verb};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;
use tokio::time::Instant;

use super::support::{configmap, created, failure, listed, next_event, watch_from, with_faults, within};

async fn outcomes(seed: u64) -> Vec<u16> {
    let faults = Faults::new(seed).error(
        Some(Verb::Patch),
        Some("configmaps"),
        0.5,
        InjectedError::Internal,
    );
    let server = with_faults(faults);
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    api.create(&PostParams::default(), &configmap("a"))
        .await
        .expect("creates are not hit");
    let mut codes = Vec::new();
    for i in 0..40 {
        let patch = Patch::Merge(json!({"data": {"i": i.to_string()}}));
        codes.push(match api.patch("a", &PatchParams::default(), &patch).await {
            Ok(_) => 200,
            Err(kube::Error::Api(status)) => status.code,
            Err(other) => panic!("{other}"),
        });
    }
    codes
}

#[tokio::test]
async fn the_same_seed_fails_the_same_requests() {
    let first = outcomes(42).await;
    assert_eq!(first, outcomes(42).await);
    assert_ne!(first, outcomes(43).await);
    assert!(first.contains(&500) && first.contains(&200), "{first:?}");
}

#[tokio::test]
async fn throttling_answers_429_with_retry_after_and_is_counted() {
    let faults = Faults::new(0).error(
        Some(Verb::Get),
        Some("configmaps"),
        1.0,
        InjectedError::TooManyRequests {
            retry_after_seconds: 7,
        },
    );
    let server = with_faults(faults);
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let throttled = failure(api.get("anything").await);
    assert_eq!(
        (throttled.code, throttled.reason.as_str()),
        (429, "TooManyRequests")
    );
    assert_eq!(throttled.details.map(|d| d.retry_after_seconds), Some(7));
    assert_eq!(
        server
            .requests()
            .matching(|k| k.code == 429 && k.verb == Verb::Get),
        1
    );
    server.set_faults(Faults::default());
    assert!(
        failure(api.get("anything").await).is_not_found(),
        "faults can be lifted"
    );
}

#[tokio::test(start_paused = true)]
async fn latency_delays_matching_requests() {
    let faults = Faults::new(0).latency(Some(Verb::List), Some("configmaps"), Duration::from_secs(3));
    let server = with_faults(faults);
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let before = tokio::time::Instant::now();
    listed(&api).await;
    assert!(
        before.elapsed() >= Duration::from_secs(3),
        "the paused clock moved by the injected latency"
    );
}

#[tokio::test]
async fn watches_are_dropped_after_n_events() {
    let server = with_faults(Faults::new(0).drop_watches_after(2));
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    for name in ["a", "b", "c"] {
        created(&api, &configmap(name)).await;
    }
    let events: Vec<_> = within(
        "dropped watch",
        api.watch(&WatchParams::default(), "0")
            .await
            .expect("watch")
            .collect(),
    )
    .await;
    assert_eq!(events.len(), 2, "{events:?}");
}

/// The delay of the tests below: long enough that "not yet" can be checked in a fraction of it on a busy
/// machine.
const WATCH_DELAY: Duration = Duration::from_secs(2);

fn added_name<K: kube::Resource>(event: &WatchEvent<K>) -> Option<String> {
    match event {
        WatchEvent::Added(object) => object.meta().name.clone(),
        _ => None,
    }
}

#[tokio::test]
async fn delayed_watch_events_arrive_late_in_order_while_lists_see_the_write_at_once() {
    let server = with_faults(Faults::new(0).delay_watch_events("configmaps", WATCH_DELAY));
    let configmaps: Api<ConfigMap> = Api::default_namespaced(server.client());
    let secrets: Api<Secret> = Api::default_namespaced(server.client());
    let from = server.resource_version().to_string();
    let params = WatchParams::default().disable_bookmarks();
    let mut delayed = configmaps.watch(&params, &from).await.expect("watch").boxed();
    let mut prompt = secrets.watch(&params, &from).await.expect("watch").boxed();

    let written = Instant::now();
    for name in ["a", "b"] {
        configmaps
            .create(&PostParams::default(), &configmap(name))
            .await
            .expect("the write is acknowledged at once");
    }
    let names: Vec<_> = listed(&configmaps)
        .await
        .iter()
        .filter_map(|cm| cm.metadata.name.clone())
        .collect();
    assert_eq!(names, ["a", "b"], "a fresh LIST sees the writes at once");

    // Another resource's stream is not held back: its event comes while the config maps still wait.
    let mut secret = Secret::default();
    secret.metadata.name = Some("s".into());
    created(&secrets, &secret).await;
    let event = next_event("secret event", &mut prompt).await;
    assert_eq!(added_name(&event).as_deref(), Some("s"), "{event:?}");
    assert!(
        written.elapsed() < WATCH_DELAY,
        "the secret's event took {:?}, as long as the delay of config maps",
        written.elapsed()
    );
    let early = tokio::time::timeout(Duration::from_millis(300), delayed.next()).await;
    assert!(early.is_err(), "a delayed event came early: {early:?}");

    let mut seen = Vec::new();
    while seen.len() < 2 {
        let event = next_event("delayed events", &mut delayed).await;
        seen.extend(added_name(&event));
    }
    assert_eq!(seen, ["a", "b"], "delivered in order");
    assert!(
        written.elapsed() >= WATCH_DELAY,
        "delivered after {:?}, before the {WATCH_DELAY:?} delay",
        written.elapsed()
    );
}

#[tokio::test]
async fn bookmarks_never_claim_a_delayed_change() {
    let server = FakeServer::builder()
        .bookmark_interval(Duration::from_millis(50))
        .faults(Faults::new(0).delay_watch_events("configmaps", WATCH_DELAY))
        .build();
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let from = server.resource_version().to_string();
    let mut stream = watch_from(&api, &from).await;
    let created = created(&api, &configmap("a")).await;
    let version: u64 = created
        .metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .expect("a numeric version");
    let mut bookmarks = Vec::new();
    let added = loop {
        match next_event("the delayed event", &mut stream).await {
            WatchEvent::Bookmark(bookmark) => {
                bookmarks.push(
                    bookmark
                        .metadata
                        .resource_version
                        .parse::<u64>()
                        .expect("numeric"),
                );
            }
            other => break other,
        }
    };
    assert_eq!(added_name(&added).as_deref(), Some("a"), "{added:?}");
    assert!(!bookmarks.is_empty(), "bookmarks came while the event waited");
    assert!(
        bookmarks.iter().all(|at| *at < version),
        "a bookmark claimed {bookmarks:?} before the change at {version} was delivered"
    );
    // Once delivered, bookmarks move on past it.
    let next = next_event("a later bookmark", &mut stream).await;
    assert!(
        matches!(&next, WatchEvent::Bookmark(b) if b.metadata.resource_version.parse::<u64>().is_ok_and(|at| at >= version)),
        "{next:?}"
    );
}

#[tokio::test]
async fn a_delay_of_forever_holds_events_back_without_breaking_the_stream() {
    let server = with_faults(Faults::new(0).delay_watch_events("configmaps", Duration::MAX));
    let configmaps: Api<ConfigMap> = Api::default_namespaced(server.client());
    let from = server.resource_version().to_string();
    let params = WatchParams::default().disable_bookmarks();
    let mut delayed = configmaps.watch(&params, &from).await.expect("watch").boxed();
    configmaps
        .create(&PostParams::default(), &configmap("a"))
        .await
        .expect("the write is acknowledged at once");
    let held = tokio::time::timeout(Duration::from_millis(300), delayed.next()).await;
    assert!(held.is_err(), "the stream neither ended nor delivered: {held:?}");
    assert_eq!(listed(&configmaps).await.len(), 1, "a fresh LIST sees the write");
}

#[tokio::test]
async fn drop_watches_ends_every_open_stream_and_spares_later_ones() {
    let server = FakeServer::new();
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    created(&api, &configmap("a")).await;
    let mut open = watch_from(&api, "0").await;
    let first = within("the first event", open.next()).await;
    assert!(matches!(first, Some(Ok(WatchEvent::Added(_)))), "{first:?}");
    server.drop_watches();
    let ended = within("the dropped stream's end", open.next()).await;
    assert!(ended.is_none(), "the open stream ended: {ended:?}");
    // A stream opened after the drop lives on and sees new changes.
    let mut later = watch_from(&api, "0").await;
    let replayed = within("the replayed event", later.next()).await;
    assert!(matches!(replayed, Some(Ok(WatchEvent::Added(_)))), "{replayed:?}");
    created(&api, &configmap("b")).await;
    let added = within("the new event", later.next()).await;
    assert_eq!(
        added.and_then(|e| e.ok()).as_ref().and_then(added_name),
        Some("b".to_owned())
    );
}

#[tokio::test]
async fn the_journal_names_each_requests_listener_object_and_times() {
    use std::net::{Ipv4Addr, SocketAddr};
    let server = FakeServer::builder().journal(100).build();
    let loopback = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let a = server.serve_as(loopback, "replica-a").await.expect("listens");
    let b = server.serve_as(loopback, "replica-b").await.expect("listens");
    let before = std::time::Instant::now();
    for (running, name) in [(&a, "from-a"), (&b, "from-b")] {
        let api: Api<ConfigMap> = Api::default_namespaced(running.client().await.expect("client"));
        created(&api, &configmap(name)).await;
    }
    let (entries, dropped) = server.take_journal();
    assert_eq!(dropped, 0);
    let creates: Vec<(&str, &str, &str)> = entries
        .iter()
        .filter(|e| e.key.verb == Verb::Create)
        .map(|e| (e.listener.as_str(), e.namespace.as_str(), e.name.as_str()))
        .collect();
    // A create names no object in its path: the collection's namespace, and no name.
    assert_eq!(
        creates,
        [("replica-a", "default", ""), ("replica-b", "default", "")]
    );
    assert!(
        entries
            .iter()
            .all(|e| e.started >= before && e.finished >= e.started),
        "arrival and answer times in order"
    );
    assert!(server.take_journal().0.is_empty(), "read entries are gone");
    a.shutdown().await;
    b.shutdown().await;
}
