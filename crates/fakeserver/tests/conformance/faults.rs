//! Fault injection: errors at a rate with the chosen code, deterministic per seed; latency; watches
//! dropped after N events.

use std::time::Duration;

use futures::StreamExt;
use gpuop_fakeserver::{FakeServer, Faults, InjectedError, Verb};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams, WatchParams};
use serde_json::json;

use super::support::{configmap, failure, within};

async fn outcomes(seed: u64) -> Vec<u16> {
    let faults = Faults::new(seed).error(
        Some(Verb::Patch),
        Some("configmaps"),
        0.5,
        InjectedError::Internal,
    );
    let server = FakeServer::builder().faults(faults).build();
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
    let server = FakeServer::builder().faults(faults).build();
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
    let server = FakeServer::builder().faults(faults).build();
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let before = tokio::time::Instant::now();
    api.list(&Default::default()).await.expect("listed");
    assert!(
        before.elapsed() >= Duration::from_secs(3),
        "the paused clock moved by the injected latency"
    );
}

#[tokio::test]
async fn watches_are_dropped_after_n_events() {
    let server = FakeServer::builder()
        .faults(Faults::new(0).drop_watches_after(2))
        .build();
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    for name in ["a", "b", "c"] {
        api.create(&PostParams::default(), &configmap(name))
            .await
            .expect("created");
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
