//! The client every controller of a running operator talks to the API server with: a thin layer over the
//! process's `kube::Client` that bounds every request in time and lets a write out only while this replica
//! leads.
//!
//! - **Leadership before every write.** A request that changes something (any method but GET and HEAD:
//!   server-side apply, patches, status, deletes, evictions, events) is refused with
//!   [`NotLeader`](crate::lease::NotLeader) unless [`Leadership::check`] passes at the moment it is sent,
//!   and it is abandoned when the leadership's renew deadline passes before it is answered. So a replica
//!   whose lease renewals hang stops writing mid-pass, not at the start of its next pass. Reads are never
//!   gated: followers keep their caches warm.
//! - **A timeout on every request.** kube's client has no read timeout by default, so a server that accepts
//!   a request and never answers would hold a pass (and with it the whole controller) forever. Every request
//!   but a watch must be answered, body and all, within [`REQUEST_TIMEOUT`]. A watch must be too, up to its
//!   response headers; its body is a stream that legitimately stays quiet for minutes (the server ends it
//!   after `timeoutSeconds`, 290 s for kube-runtime's watcher), so a read timeout on it would have to be
//!   longer than that, and kube-runtime's watcher already drops a stream idle for `timeoutSeconds + 5 s`
//!   and watches again. The same bound on the connection itself is the kube `Config`'s
//!   `connect_timeout`, set where the process builds its client ([`crate::cli`]).
//!
//! Lease requests do not go through this layer: they are writes a follower must make, and the election
//! bounds each of them by its own, shorter, timeout ([`crate::lease::Timing::request_timeout`]).

use std::time::Duration;

use http::{Method, Request, Response};
use kube::Client;
use kube::client::Body;

use crate::lease::{Leadership, NotLeader};

/// How long any request but a watch's stream may take, answer and body. kube-apiserver gives up on a
/// request after 60 s (`--request-timeout`); a list page or a write answers in well under a second.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A request given up on: no answer within its time.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{method} {path}: no answer within {limit:?}{}", if *.leadership_ended { ", when this replica's leadership ended" } else { "" })]
pub struct TimedOut {
    /// The request's method.
    pub method: String,
    /// Its path, without the query.
    pub path: String,
    /// How long it was given.
    pub limit: Duration,
    /// Whether the limit was the end of this replica's leadership rather than [`REQUEST_TIMEOUT`].
    pub leadership_ended: bool,
}

/// What happens to one request: sent with a time limit, or refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Send it; give up after this long. `leadership` says the limit is the end of the leadership.
    Send {
        /// The time limit.
        limit: Duration,
        /// Whether the limit is the leadership's end.
        leadership: bool,
        /// Whether only the response headers are bounded (a watch).
        stream: bool,
    },
    /// Do not send it: it writes and this replica does not lead.
    NotLeader,
}

/// The decision for one request, from its method and query and how long this replica may still write
/// (`None`: without end). Pure, so that it is tested without a server.
pub fn gate(method: &Method, query: Option<&str>, time_left: Option<Duration>) -> Gate {
    let writes = !matches!(*method, Method::GET | Method::HEAD);
    if !writes {
        return Gate::Send {
            limit: REQUEST_TIMEOUT,
            leadership: false,
            stream: is_watch(query),
        };
    }
    match time_left {
        Some(left) if left.is_zero() => Gate::NotLeader,
        Some(left) if left < REQUEST_TIMEOUT => Gate::Send {
            limit: left,
            leadership: true,
            stream: false,
        },
        _ => Gate::Send {
            limit: REQUEST_TIMEOUT,
            leadership: false,
            stream: false,
        },
    }
}

fn is_watch(query: Option<&str>) -> bool {
    query
        .unwrap_or_default()
        .split('&')
        .any(|pair| matches!(pair, "watch=true" | "watch=1"))
}

/// `client`, with every write gated on `leadership` and every request bounded in time (see the module
/// docs).
pub fn gated(client: Client, leadership: Leadership) -> Client {
    let namespace = client.default_namespace().to_owned();
    let service = tower::service_fn(move |request: Request<Body>| {
        let client = client.clone();
        let leadership = leadership.clone();
        async move { send(&client, &leadership, request).await }
    });
    Client::new(service, namespace)
}

async fn send(
    client: &Client,
    leadership: &Leadership,
    request: Request<Body>,
) -> Result<Response<Body>, tower::BoxError> {
    let method = request.method().clone();
    let decision = gate(&method, request.uri().query(), leadership.time_left());
    let Gate::Send {
        limit,
        leadership: limited_by_leadership,
        stream,
    } = decision
    else {
        return Err(Box::new(crate::lease::NotLeader));
    };
    // A write checks the leadership itself again at the last moment: the clock moved since `time_left`.
    if !matches!(method, Method::GET | Method::HEAD) {
        leadership.check()?;
    }
    let timed_out = TimedOut {
        method: method.to_string(),
        path: request.uri().path().to_owned(),
        limit,
        leadership_ended: limited_by_leadership,
    };
    let exchange = async {
        let response = client.send(request).await?;
        if stream {
            return Ok::<_, kube::Error>(response);
        }
        let (parts, body) = response.into_parts();
        let bytes = body.collect_bytes().await?;
        Ok(Response::from_parts(parts, Body::from(bytes)))
    };
    match tokio::time::timeout(limit, exchange).await {
        Ok(Ok(response)) => Ok(response),
        Ok(Err(error)) => Err(Box::new(error)),
        Err(_) => Err(Box::new(timed_out)),
    }
}

/// Whether `error`, or any error it was caused by, is [`NotLeader`] (a write this replica did not send
/// because it does not lead) or a write abandoned when its leadership ended: no failure to log or retry.
pub fn is_not_leader(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(error) = current {
        if error.is::<NotLeader>() {
            return true;
        }
        // A write cut off because the leadership ended while it waited for its answer.
        if let Some(timed_out) = error.downcast_ref::<TimedOut>()
            && timed_out.leadership_ended
        {
            return true;
        }
        current = error.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuop_fakeserver::{FakeServer, Faults, Verb};
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::Api;
    use kube::api::{ListParams, PostParams};

    #[test]
    fn a_refused_write_is_recognised_through_the_errors_that_wrap_it() {
        let wrapped = kube::Error::Service(Box::new(NotLeader));
        assert!(is_not_leader(&wrapped));
        let other = kube::Error::Service("connection reset".into());
        assert!(!is_not_leader(&other));
        let cut_off = |leadership_ended| {
            kube::Error::Service(Box::new(TimedOut {
                method: "PATCH".into(),
                path: "/api/v1/nodes/gpu-0".into(),
                limit: Duration::from_secs(3),
                leadership_ended,
            }))
        };
        assert!(
            is_not_leader(&cut_off(true)),
            "abandoned when the leadership ended"
        );
        assert!(!is_not_leader(&cut_off(false)), "a plain timeout is a failure");
    }

    #[test]
    fn writes_wait_for_leadership_and_end_with_it() {
        let secs = Duration::from_secs;
        assert_eq!(gate(&Method::PATCH, None, Some(Duration::ZERO)), Gate::NotLeader);
        assert_eq!(gate(&Method::DELETE, None, Some(Duration::ZERO)), Gate::NotLeader);
        assert_eq!(
            gate(&Method::POST, None, Some(secs(3))),
            Gate::Send {
                limit: secs(3),
                leadership: true,
                stream: false
            },
            "a write is abandoned when the leadership ends"
        );
        assert_eq!(
            gate(&Method::PUT, None, None),
            Gate::Send {
                limit: REQUEST_TIMEOUT,
                leadership: false,
                stream: false
            }
        );
        assert_eq!(
            gate(&Method::GET, Some("labelSelector=a"), Some(Duration::ZERO)),
            Gate::Send {
                limit: REQUEST_TIMEOUT,
                leadership: false,
                stream: false
            },
            "followers read"
        );
        assert_eq!(
            gate(
                &Method::GET,
                Some("allowWatchBookmarks=true&watch=true"),
                Some(Duration::ZERO)
            ),
            Gate::Send {
                limit: REQUEST_TIMEOUT,
                leadership: false,
                stream: true
            },
            "only a watch's headers are bounded"
        );
        assert!(!is_watch(Some("watchful=true")));
    }

    fn config_map(name: &str) -> ConfigMap {
        ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some(name.to_owned()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_follower_sends_no_write_and_a_hung_request_ends() {
        let server = FakeServer::new();
        let (sender, leadership) = crate::lease::Leadership::for_tests();
        let api: Api<ConfigMap> = Api::default_namespaced(gated(server.client_as("replica"), leadership));
        let error = api
            .create(&PostParams::default(), &config_map("a"))
            .await
            .expect_err("a follower does not write");
        assert!(is_not_leader(&error), "{error}");
        assert_eq!(server.requests().by_client("replica"), 0, "nothing was sent");
        api.list(&ListParams::default()).await.expect("a follower reads");

        sender(Some(Duration::from_secs(5)));
        api.create(&PostParams::default(), &config_map("a"))
            .await
            .expect("the leader writes");
        // A hung write is given up when the leadership ends, not 30 s later.
        server.set_faults(Faults::new(0).hang(Some(Verb::Create), None, Some("replica")));
        let started = tokio::time::Instant::now();
        let error = api
            .create(&PostParams::default(), &config_map("b"))
            .await
            .expect_err("hangs");
        assert!(error.to_string().contains("leadership ended"), "{error}");
        assert!(started.elapsed() <= Duration::from_secs(5));
        // A hung read is given up after the request timeout.
        server.set_faults(Faults::new(0).hang(Some(Verb::List), None, Some("replica")));
        let started = tokio::time::Instant::now();
        let error = api.list(&ListParams::default()).await.expect_err("hangs");
        assert!(error.to_string().contains("no answer within 30s"), "{error}");
        assert_eq!(started.elapsed(), REQUEST_TIMEOUT);
    }
}
