//! Leader election on a `coordination.k8s.io/v1` Lease, with client-go's semantics so that replicas of this
//! operator and of NVIDIA's (same lease name) never both lead: create the Lease if missing, renew it while
//! holding it, take it over only when its holder stopped renewing for a whole lease duration as observed by
//! this replica's own clock (not the holder's timestamps, so clock skew does not matter), and write only with
//! a `resourceVersion` precondition, so that of two racing replicas one gets a 409 and stays a follower.
//!
//! Leadership gates writes, not reads: every replica runs its caches; [`Leadership`] tells the controllers
//! whether they may write.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::PostParams;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

/// Timing of the election (client-go's defaults: 15 s lease, 10 s renew deadline, 2 s retry).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// How long a lease is valid after its last renewal.
    pub lease_duration: Duration,
    /// How often the holder renews, and a candidate retries.
    pub retry_period: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// What a replica should do next about the lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nobody holds it: create it.
    Create,
    /// We hold it: renew it.
    Renew,
    /// Its holder stopped renewing: take it over.
    TakeOver,
    /// Someone else holds it and renews it: wait.
    Follow {
        /// The holder.
        holder: String,
    },
}

/// The decision, from the lease as last read and when this replica last saw it change.
pub fn next_step(
    lease: Option<&LeaseSpec>,
    identity: &str,
    last_change_seen: Instant,
    now: Instant,
    timing: Timing,
) -> Step {
    let Some(spec) = lease else { return Step::Create };
    match spec.holder_identity.as_deref().filter(|h| !h.is_empty()) {
        None => Step::TakeOver,
        Some(holder) if holder == identity => Step::Renew,
        Some(holder) => {
            let duration = spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map_or(timing.lease_duration, Duration::from_secs);
            if now.duration_since(last_change_seen) > duration {
                Step::TakeOver
            } else {
                Step::Follow {
                    holder: holder.to_owned(),
                }
            }
        }
    }
}

/// Whether this replica currently leads; cloned freely.
#[derive(Clone, Debug)]
pub struct Leadership {
    receiver: watch::Receiver<bool>,
    /// Keeps the channel open for a leadership nobody else updates.
    _fixed: Option<std::sync::Arc<watch::Sender<bool>>>,
}

impl Leadership {
    /// A replica that always leads (single-replica runs and tests).
    pub fn always() -> Self {
        let (sender, receiver) = watch::channel(true);
        Self {
            receiver,
            _fixed: Some(std::sync::Arc::new(sender)),
        }
    }

    /// Whether this replica may write now.
    pub fn is_leader(&self) -> bool {
        *self.receiver.borrow()
    }

    /// Waits until this replica leads.
    pub async fn until_leader(&mut self) {
        let _ = self.receiver.wait_for(|leading| *leading).await;
    }

    /// Waits until leadership changes; returns the new value.
    pub async fn changed(&mut self) -> bool {
        let _ = self.receiver.changed().await;
        *self.receiver.borrow()
    }
}

/// Runs the election until `shutdown` resolves, then gives the lease up. Returns the leadership signal
/// immediately; the election runs on a spawned task.
pub fn elect(
    api: Api<Lease>,
    name: String,
    identity: String,
    timing: Timing,
    shutdown: tokio_util::sync::CancellationToken,
) -> (Leadership, tokio::task::JoinHandle<()>) {
    let (sender, receiver) = watch::channel(false);
    let task = tokio::spawn(async move {
        let mut seen: Option<(Option<String>, Instant)> = None;
        loop {
            let leading = attempt(&api, &name, &identity, timing, &mut seen).await;
            if *sender.borrow() != leading {
                info!(lease = %name, %identity, leading, "leadership changed");
                sender.send_replace(leading);
            }
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(timing.retry_period) => {}
            }
        }
        if *sender.borrow() {
            sender.send_replace(false);
            release(&api, &name, &identity).await;
        }
    });
    (
        Leadership {
            receiver,
            _fixed: None,
        },
        task,
    )
}

/// One round: read the lease, act on it; returns whether this replica leads afterwards.
async fn attempt(
    api: &Api<Lease>,
    name: &str,
    identity: &str,
    timing: Timing,
    seen: &mut Option<(Option<String>, Instant)>,
) -> bool {
    let now = Instant::now();
    let current = match api.get_opt(name).await {
        Ok(current) => current,
        Err(error) => {
            warn!(lease = %name, %error, "cannot read the lease");
            return false;
        }
    };
    // The holder's clock is not trusted: expiry counts from when this replica saw the lease change.
    let version = current
        .as_ref()
        .and_then(|lease| lease.metadata.resource_version.clone());
    let last_change = match seen {
        Some((seen_version, at)) if *seen_version == version => *at,
        _ => {
            *seen = Some((version, now));
            now
        }
    };
    let step = next_step(
        current.as_ref().and_then(|l| l.spec.as_ref()),
        identity,
        last_change,
        now,
        timing,
    );
    let stamp = MicroTime(k8s_openapi::jiff::Timestamp::now());
    let duration_seconds = i32::try_from(timing.lease_duration.as_secs()).unwrap_or(i32::MAX);
    let written = match (step, current) {
        (Step::Follow { .. }, _) => return false,
        (Step::Create, _) => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.to_owned()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(identity.to_owned()),
                    lease_duration_seconds: Some(duration_seconds),
                    acquire_time: Some(stamp.clone()),
                    renew_time: Some(stamp),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            api.create(&PostParams::default(), &lease).await
        }
        (step, Some(mut lease)) => {
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            if step == Step::TakeOver {
                spec.holder_identity = Some(identity.to_owned());
                spec.acquire_time = Some(stamp.clone());
                spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            }
            spec.lease_duration_seconds = Some(duration_seconds);
            spec.renew_time = Some(stamp);
            // `replace` sends the resourceVersion we read: a rival's write in between makes this a 409.
            api.replace(name, &PostParams::default(), &lease).await
        }
        (Step::Renew | Step::TakeOver, None) => return false,
    };
    match written {
        Ok(lease) => {
            *seen = Some((lease.metadata.resource_version, Instant::now()));
            true
        }
        Err(kube::Error::Api(status)) if status.code == 409 => false,
        Err(error) => {
            warn!(lease = %name, %error, "cannot write the lease");
            false
        }
    }
}

/// Gives the lease up so that another replica takes over at once, as client-go's `ReleaseOnCancel` does.
async fn release(api: &Api<Lease>, name: &str, identity: &str) {
    let Ok(Some(mut lease)) = api.get_opt(name).await else {
        return;
    };
    let Some(spec) = lease.spec.as_mut() else { return };
    if spec.holder_identity.as_deref() != Some(identity) {
        return;
    }
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    match api.replace(name, &PostParams::default(), &lease).await {
        Ok(_) => info!(lease = %name, %identity, "released the lease"),
        Err(error) => warn!(lease = %name, %error, "cannot release the lease"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: Option<&str>, duration: Option<i32>) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            lease_duration_seconds: duration,
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn follows_a_live_holder_and_takes_over_an_expired_one() {
        let timing = Timing::default();
        let seen = Instant::now();
        let live = spec(Some("other"), Some(15));
        assert_eq!(
            next_step(Some(&live), "me", seen, seen + Duration::from_secs(10), timing),
            Step::Follow {
                holder: "other".into()
            }
        );
        assert_eq!(
            next_step(Some(&live), "me", seen, seen + Duration::from_secs(16), timing),
            Step::TakeOver
        );
        // The lease's own duration wins over ours.
        let short = spec(Some("other"), Some(5));
        assert_eq!(
            next_step(Some(&short), "me", seen, seen + Duration::from_secs(6), timing),
            Step::TakeOver
        );
    }

    #[test]
    fn creates_renews_and_claims_a_released_lease() {
        let now = Instant::now();
        let timing = Timing::default();
        assert_eq!(next_step(None, "me", now, now, timing), Step::Create);
        assert_eq!(
            next_step(Some(&spec(Some("me"), Some(15))), "me", now, now, timing),
            Step::Renew
        );
        assert_eq!(
            next_step(Some(&spec(None, Some(1))), "me", now, now, timing),
            Step::TakeOver
        );
        assert_eq!(
            next_step(Some(&spec(Some(""), Some(1))), "me", now, now, timing),
            Step::TakeOver
        );
    }
}
