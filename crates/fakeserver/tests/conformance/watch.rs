//! Watches as kube-runtime uses them: events, bookmarks, replay from a version, the in-stream 410 and
//! the relist it causes, streaming lists, selector transitions and timeouts.

use std::time::Duration;

use futures::StreamExt;
use gpuop_fakeserver::{FakeServer, Faults, Verb};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, WatchEvent, WatchParams};
use kube::runtime::watcher::{self, Event};
use serde_json::json;

use super::support::{
    configmap, created, labelled_configmap, merge_patched, next_event, server, watch_from, with_faults,
    within,
};

fn name_of(event: &WatchEvent<ConfigMap>) -> String {
    match event {
        WatchEvent::Added(cm) | WatchEvent::Modified(cm) | WatchEvent::Deleted(cm) => {
            format!(
                "{:?}:{}",
                std::mem::discriminant(event),
                cm.metadata.name.clone().unwrap_or_default()
            )
        }
        other => format!("{other:?}"),
    }
}

#[tokio::test]
async fn a_watch_from_a_version_replays_what_followed_then_sends_bookmarks() {
    let server = FakeServer::builder()
        .bookmark_interval(Duration::from_millis(50))
        .build();
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let a = created(&api, &configmap("a")).await;
    let from = a.metadata.resource_version.clone().expect("versioned");
    merge_patched(&api, "a", json!({"data": {"k": "v"}})).await;
    created(&api, &configmap("b")).await;

    let mut stream = watch_from(&api, &from).await;
    let first = next_event("replayed modify", &mut stream).await;
    assert!(
        matches!(&first, WatchEvent::Modified(cm) if cm.data.is_some()),
        "{first:?}"
    );
    let second = next_event("replayed add", &mut stream).await;
    assert!(
        matches!(&second, WatchEvent::Added(cm) if cm.metadata.name.as_deref() == Some("b")),
        "{second:?}"
    );
    let current: u64 = server.resource_version();
    let bookmark = next_event("bookmark", &mut stream).await;
    let WatchEvent::Bookmark(bookmark) = bookmark else {
        panic!("expected a bookmark, got {bookmark:?}")
    };
    let at: u64 = bookmark.metadata.resource_version.parse().expect("numeric");
    assert!(at >= current, "bookmark at {at}, current {current}");
}

#[tokio::test]
async fn an_expired_version_is_an_error_event_with_code_410_then_the_end() {
    let server = server();
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let a = created(&api, &configmap("a")).await;
    created(&api, &configmap("b")).await;
    server.compact();
    let old = a.metadata.resource_version.expect("versioned");
    // The request itself succeeds (HTTP 200): the expiry is reported inside the stream.
    let events: Vec<_> = within(
        "expired watch",
        api.watch(&WatchParams::default(), &old)
            .await
            .expect("200")
            .collect(),
    )
    .await;
    assert_eq!(events.len(), 1, "{events:?}");
    let Ok(WatchEvent::Error(status)) = &events[0] else {
        panic!("expected an ERROR event, got {events:?}")
    };
    assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
}

#[tokio::test]
async fn the_watcher_relists_after_an_expired_version() {
    // Watches end at once, so the watcher keeps re-watching from its list's version; compaction then
    // expires that version, and the watcher must relist to see what changed.
    let server = with_faults(Faults::new(0).drop_watches_after(0));
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    created(&api, &configmap("before")).await;
    let mut events = watcher::watcher(api.clone(), watcher::Config::default()).boxed();
    loop {
        if let Event::InitDone = next_event("initial list", &mut events).await {
            break;
        }
    }
    created(&api, &configmap("after")).await;
    server.compact();
    server.set_faults(Faults::default());
    let mut relisted = Vec::new();
    let mut saw_410 = false;
    loop {
        match within("relist", events.next()).await.expect("stream continues") {
            Err(watcher::Error::WatchError(status)) if status.code == 410 => saw_410 = true,
            Err(other) => panic!("unexpected watcher error {other:?}"),
            Ok(Event::InitApply(cm)) => relisted.push(cm.metadata.name.unwrap_or_default()),
            Ok(Event::InitDone) if !relisted.is_empty() => break,
            Ok(_) => {}
        }
    }
    assert!(saw_410, "the watcher was told its version expired");
    assert_eq!(relisted, ["after", "before"]);
    assert!(server.requests().count(Verb::List, "configmaps") >= 2);
}

#[tokio::test]
async fn streaming_lists_finish_with_the_initial_events_end_bookmark() {
    let server = server();
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    for name in ["a", "b"] {
        created(&api, &configmap(name)).await;
    }
    let config = watcher::Config::default().streaming_lists();
    let mut events = watcher::watcher(api.clone(), config).boxed();
    let mut initial = Vec::new();
    loop {
        match next_event("initial events", &mut events).await {
            Event::InitApply(cm) => initial.push(cm.metadata.name.unwrap_or_default()),
            Event::InitDone => break,
            _ => {}
        }
    }
    assert_eq!(initial, ["a", "b"]);
    assert_eq!(
        server.requests().count(Verb::List, "configmaps"),
        0,
        "no LIST with streaming lists"
    );
    created(&api, &configmap("c")).await;
    let live = next_event("live event", &mut events).await;
    assert!(matches!(live, Event::Apply(cm) if cm.metadata.name.as_deref() == Some("c")));
}

#[tokio::test]
async fn objects_entering_and_leaving_a_selector_are_added_and_deleted() {
    let server = server();
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let version = server.resource_version().to_string();
    let mut stream = api
        .watch(&WatchParams::default().labels("gpu=true"), &version)
        .await
        .expect("watch")
        .boxed();
    created(&api, &labelled_configmap("n1", &[("gpu", "false")])).await;
    let patch = |value: &str| Patch::Merge(json!({"metadata": {"labels": {"gpu": value}}}));
    api.patch("n1", &PatchParams::default(), &patch("true"))
        .await
        .expect("patched");
    api.patch("n1", &PatchParams::default(), &patch("false"))
        .await
        .expect("patched");
    let mut seen = Vec::new();
    for _ in 0..2 {
        let event = next_event("selector events", &mut stream).await;
        seen.push(match event {
            WatchEvent::Added(cm) => format!("ADDED {:?}", cm.labels().get("gpu")),
            WatchEvent::Deleted(cm) => format!("DELETED {:?}", cm.labels().get("gpu")),
            other => name_of(&other),
        });
    }
    // Leaving the selector is reported with the object as it last matched.
    assert_eq!(seen, [r#"ADDED Some("true")"#, r#"DELETED Some("true")"#]);
}

#[tokio::test]
async fn a_watch_ends_at_its_timeout() {
    let server = server();
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let stream = api
        .watch(&WatchParams::default().timeout(1).disable_bookmarks(), "0")
        .await
        .expect("watch");
    let events: Vec<_> = within("timeout", stream.collect()).await;
    assert!(events.is_empty(), "{events:?}");
}

use kube::ResourceExt;
