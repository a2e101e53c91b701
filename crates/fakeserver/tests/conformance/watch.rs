//! Watches as kube-runtime uses them: events, bookmarks, replay from a version, the in-stream 410 and
//! the relist it causes, streaming lists, selector transitions and timeouts.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use gpuop_fakeserver::{FakeServer, Faults, Verb};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::watcher::{self, Event};
use serde_json::json;

use super::support::{configmap, labelled_configmap, server, within};

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
    let a = api
        .create(&PostParams::default(), &configmap("a"))
        .await
        .expect("created");
    let from = a.metadata.resource_version.clone().expect("versioned");
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "v"}})),
    )
    .await
    .expect("patched");
    api.create(&PostParams::default(), &configmap("b"))
        .await
        .expect("created");

    let mut stream = api
        .watch(&WatchParams::default(), &from)
        .await
        .expect("watch")
        .boxed();
    let first = within("replayed modify", stream.try_next())
        .await
        .expect("ok")
        .expect("event");
    assert!(
        matches!(&first, WatchEvent::Modified(cm) if cm.data.is_some()),
        "{first:?}"
    );
    let second = within("replayed add", stream.try_next())
        .await
        .expect("ok")
        .expect("event");
    assert!(
        matches!(&second, WatchEvent::Added(cm) if cm.metadata.name.as_deref() == Some("b")),
        "{second:?}"
    );
    let current: u64 = server.resource_version();
    let bookmark = within("bookmark", stream.try_next())
        .await
        .expect("ok")
        .expect("event");
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
    let a = api
        .create(&PostParams::default(), &configmap("a"))
        .await
        .expect("created");
    api.create(&PostParams::default(), &configmap("b"))
        .await
        .expect("created");
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
    let server = FakeServer::builder()
        .faults(Faults::new(0).drop_watches_after(0))
        .build();
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    api.create(&PostParams::default(), &configmap("before"))
        .await
        .expect("created");
    let mut events = watcher::watcher(api.clone(), watcher::Config::default()).boxed();
    loop {
        if let Event::InitDone = within("initial list", events.try_next())
            .await
            .expect("ok")
            .expect("event")
        {
            break;
        }
    }
    api.create(&PostParams::default(), &configmap("after"))
        .await
        .expect("created");
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
        api.create(&PostParams::default(), &configmap(name))
            .await
            .expect("created");
    }
    let config = watcher::Config::default().streaming_lists();
    let mut events = watcher::watcher(api.clone(), config).boxed();
    let mut initial = Vec::new();
    loop {
        match within("initial events", events.try_next())
            .await
            .expect("ok")
            .expect("event")
        {
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
    api.create(&PostParams::default(), &configmap("c"))
        .await
        .expect("created");
    let live = within("live event", events.try_next())
        .await
        .expect("ok")
        .expect("event");
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
    api.create(
        &PostParams::default(),
        &labelled_configmap("n1", &[("gpu", "false")]),
    )
    .await
    .expect("created");
    let patch = |value: &str| Patch::Merge(json!({"metadata": {"labels": {"gpu": value}}}));
    api.patch("n1", &PatchParams::default(), &patch("true"))
        .await
        .expect("patched");
    api.patch("n1", &PatchParams::default(), &patch("false"))
        .await
        .expect("patched");
    let mut seen = Vec::new();
    for _ in 0..2 {
        let event = within("selector events", stream.try_next())
            .await
            .expect("ok")
            .expect("event");
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
