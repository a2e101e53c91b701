//! Leader election on a `coordination.k8s.io/v1` Lease, with client-go's semantics so that replicas of this
//! operator and of NVIDIA's (same lease name) never both lead: create the Lease if missing, renew it while
//! holding it, take it over only when its holder stopped renewing for a whole lease duration as observed by
//! this replica's own clock (not the holder's timestamps, so clock skew does not matter), and write only with
//! a `resourceVersion` precondition, so that of two racing replicas one gets a 409 and stays a follower.
//!
//! Leadership gates writes, not reads: every replica runs its caches; [`Leadership`] tells the controllers
//! whether they may write.
//!
//! Leadership is a deadline, not a flag. A renewal whose request was sent at `t` and succeeded lets this
//! replica write until `t + renew deadline`; nothing else extends it. Another replica can take over only a
//! whole lease duration after it saw that renewal, which was after `t`: so the leader stops writing at least
//! `lease duration - renew deadline` (5 s by default) before anyone else may start, whatever happens to its
//! lease requests (a hung API server, a dropped connection, a stalled election task). Every lease request has
//! its own timeout ([`Timing::request_timeout`]), shorter than the renew deadline, so one hung request cannot
//! use up the time for the next attempts. The deadline is read from the clock at each check
//! ([`Leadership::check`]), so a replica whose election task is stuck still stops writing on time.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use kube::Api;
use kube::api::{DeleteParams, PostParams, Preconditions};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

/// Timing of the election (client-go's defaults: 15 s lease, 10 s renew deadline, 2 s retry).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// How long a lease is valid after its last renewal, as other replicas count it. Whole seconds: the
    /// Lease stores it as `leaseDurationSeconds`.
    pub lease_duration: Duration,
    /// How long after sending its last successful renewal the leader may write; shorter than the lease
    /// duration, so that the leader has stopped before another replica may take over.
    pub renew_deadline: Duration,
    /// How often the holder renews, and a candidate retries.
    pub retry_period: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// Lease timings that would let two replicas lead at once, or never let one lead.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TimingError {
    /// The lease duration is not a positive whole number of seconds.
    #[error(
        "leader election: the lease duration {0:?} must be a whole number of seconds, at least 1 s (the Lease stores leaseDurationSeconds)"
    )]
    LeaseDuration(Duration),
    /// The renew deadline does not end before the lease expires.
    #[error(
        "leader election: the renew deadline {renew_deadline:?} must be shorter than the lease duration {lease_duration:?}, or a leader whose renewals hang would still write after another replica took over"
    )]
    RenewDeadline {
        /// The renew deadline.
        renew_deadline: Duration,
        /// The lease duration.
        lease_duration: Duration,
    },
    /// The retry period leaves no room for a second renewal within the renew deadline.
    #[error(
        "leader election: the retry period {retry_period:?} must be positive and shorter than the renew deadline {renew_deadline:?}, or one failed renewal ends the leadership"
    )]
    RetryPeriod {
        /// The retry period.
        retry_period: Duration,
        /// The renew deadline.
        renew_deadline: Duration,
    },
}

impl Timing {
    /// The timing, if a leader that cannot renew stops writing before its lease can expire elsewhere.
    pub fn validate(self) -> Result<Self, TimingError> {
        let lease = self.lease_duration;
        if lease.subsec_nanos() != 0 || lease.is_zero() {
            return Err(TimingError::LeaseDuration(lease));
        }
        if self.renew_deadline >= lease {
            return Err(TimingError::RenewDeadline {
                renew_deadline: self.renew_deadline,
                lease_duration: lease,
            });
        }
        if self.retry_period.is_zero() || self.retry_period >= self.renew_deadline {
            return Err(TimingError::RetryPeriod {
                retry_period: self.retry_period,
                renew_deadline: self.renew_deadline,
            });
        }
        Ok(self)
    }

    /// How long one lease request may take: half the renew deadline (controller-runtime's choice), so that a
    /// hung request leaves time for another attempt before the leadership ends.
    pub fn request_timeout(self) -> Duration {
        self.renew_deadline / 2
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

/// How long this replica may write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Term {
    /// Not at all.
    Follower,
    /// Until this instant: the renew deadline after the last successful renewal was sent.
    Until(Instant),
    /// For good: a single replica without election.
    Always,
}

impl Term {
    fn leads(self, now: Instant) -> bool {
        match self {
            Self::Follower => false,
            Self::Until(deadline) => now < deadline,
            Self::Always => true,
        }
    }
}

/// A write refused because this replica does not lead (or no longer does: its lease was not renewed within
/// the renew deadline). Callers stop what they were writing, quietly: the leader writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "not the leader: this replica holds no lease renewed within the renew deadline, so it writes nothing"
)]
pub struct NotLeader;

/// Whether this replica may write, and until when; cloned freely.
#[derive(Clone, Debug)]
pub struct Leadership {
    receiver: watch::Receiver<Term>,
    /// What [`Leadership::changed`] last returned (or found when first called): a change between two calls
    /// (while the caller ran a pass) is reported by the next call, not lost.
    seen: Option<bool>,
    /// Keeps the channel open for a leadership nobody else updates.
    _fixed: Option<std::sync::Arc<watch::Sender<Term>>>,
}

impl Leadership {
    /// A replica that always leads (single-replica runs and tests).
    pub fn always() -> Self {
        let (sender, receiver) = watch::channel(Term::Always);
        Self {
            receiver,
            seen: None,
            _fixed: Some(std::sync::Arc::new(sender)),
        }
    }

    /// `Ok` when this replica may write now: it leads, and the renew deadline of its last successful
    /// renewal has not passed. Every write checks this just before it is sent.
    pub fn check(&self) -> Result<(), NotLeader> {
        if self.term().leads(Instant::now()) {
            Ok(())
        } else {
            Err(NotLeader)
        }
    }

    /// Whether this replica may write now (see [`Leadership::check`]).
    pub fn is_leader(&self) -> bool {
        self.check().is_ok()
    }

    /// How much longer this replica may write without another renewal: zero when it does not lead, `None`
    /// when its leadership has no end (a single replica).
    pub fn time_left(&self) -> Option<Duration> {
        match self.term() {
            Term::Follower => Some(Duration::ZERO),
            Term::Until(deadline) => Some(deadline.saturating_duration_since(Instant::now())),
            Term::Always => None,
        }
    }

    fn term(&self) -> Term {
        *self.receiver.borrow()
    }

    /// A leadership the test sets by hand: `Some(d)` leads for `d` from now, `None` follows.
    #[cfg(test)]
    pub(crate) fn for_tests() -> (impl Fn(Option<Duration>), Self) {
        let (sender, receiver) = watch::channel(Term::Follower);
        let set = move |term: Option<Duration>| {
            sender.send_replace(term.map_or(Term::Follower, |left| Term::Until(Instant::now() + left)));
        };
        (
            set,
            Self {
                receiver,
                seen: None,
                _fixed: None,
            },
        )
    }

    /// Waits until this replica leads.
    pub async fn until_leader(&mut self) {
        while !self.is_leader() {
            self.changed().await;
        }
    }

    /// Waits until this replica starts or stops leading, including by its renew deadline passing; returns
    /// whether it leads.
    pub async fn changed(&mut self) -> bool {
        let leading = self.is_leader();
        let before = *self.seen.get_or_insert(leading);
        // A start or an end of leadership was announced since the last call (an extension is not): both
        // may have happened while the caller was busy, leaving the same answer but a pass to make.
        if self.receiver.has_changed().unwrap_or(false) {
            self.receiver.borrow_and_update();
            self.seen = Some(leading);
            return leading;
        }
        loop {
            let now = self.is_leader();
            if now != before {
                self.seen = Some(now);
                return now;
            }
            let expiry = match *self.receiver.borrow_and_update() {
                Term::Until(deadline) if Instant::now() < deadline => Some(deadline),
                Term::Until(_) | Term::Follower | Term::Always => None,
            };
            let expired = async {
                match expiry {
                    Some(deadline) => tokio::time::sleep_until(deadline).await,
                    None => std::future::pending().await,
                }
            };
            tokio::pin!(expired);
            tokio::select! {
                changed = self.receiver.changed() => {
                    if changed.is_err() {
                        // Nobody updates it any more: only the deadline can end it.
                        (&mut expired).await;
                    }
                }
                () = &mut expired => {}
            }
        }
    }
}

/// Runs the election until `shutdown` resolves, then gives the lease up. Returns the leadership signal
/// immediately; the election runs on a spawned task. `timing` must be [`Timing::validate`]d.
pub fn elect(
    api: Api<Lease>,
    name: String,
    identity: String,
    owner: Option<OwnerReference>,
    timing: Timing,
    shutdown: tokio_util::sync::CancellationToken,
) -> (Leadership, tokio::task::JoinHandle<()>) {
    let (sender, receiver) = watch::channel(Term::Follower);
    let task = tokio::spawn(async move {
        let mut seen: Option<(Option<String>, Instant)> = None;
        loop {
            let outcome = attempt(&api, &name, &identity, owner.as_ref(), timing, &mut seen).await;
            let now = Instant::now();
            match outcome {
                Attempt::Held { sent } => {
                    let until = sent + timing.renew_deadline;
                    // Only a start of leadership wakes the controllers; an extension changes nothing they do.
                    let started = sender.send_if_modified(|term| {
                        let was = term.leads(now);
                        *term = match *term {
                            Term::Until(old) if old > until => Term::Until(old),
                            _ => Term::Until(until),
                        };
                        !was && term.leads(now)
                    });
                    if started {
                        info!(lease = %name, %identity, leading = true, "leadership changed");
                    }
                }
                Attempt::Follows { holder } => {
                    if step_down(&sender, now) {
                        info!(lease = %name, %identity, %holder, leading = false, "leadership changed: another replica holds the lease");
                    }
                }
                Attempt::Unsure => {
                    let expired = matches!(*sender.borrow(), Term::Until(deadline) if now >= deadline);
                    if expired {
                        sender.send_replace(Term::Follower);
                        warn!(
                            lease = %name,
                            %identity,
                            leading = false,
                            renew_deadline = ?timing.renew_deadline,
                            "leadership changed: the lease was not renewed within the renew deadline; writing nothing until it is"
                        );
                    }
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(timing.retry_period) => {}
            }
        }
        if step_down(&sender, Instant::now()) {
            release(&api, &name, &identity, timing.request_timeout()).await;
        }
    });
    (
        Leadership {
            receiver,
            seen: None,
            _fixed: None,
        },
        task,
    )
}

/// Ends the leadership now; returns whether this replica was leading.
fn step_down(sender: &watch::Sender<Term>, now: Instant) -> bool {
    let mut was = false;
    sender.send_if_modified(|term| {
        was = term.leads(now);
        *term = Term::Follower;
        was
    });
    was
}

/// What one round of the election found out.
#[derive(Debug)]
enum Attempt {
    /// This replica holds the lease: its write, sent at `sent`, succeeded.
    Held {
        /// When the successful write was sent.
        sent: Instant,
    },
    /// Another replica holds the lease and renews it.
    Follows {
        /// The holder.
        holder: String,
    },
    /// Nothing was learned (an error, a timeout, a conflict): the current leadership runs out by itself.
    Unsure,
}

/// One round: read the lease, act on it.
async fn attempt(
    api: &Api<Lease>,
    name: &str,
    identity: &str,
    owner: Option<&OwnerReference>,
    timing: Timing,
    seen: &mut Option<(Option<String>, Instant)>,
) -> Attempt {
    let timeout = timing.request_timeout();
    let current = match tokio::time::timeout(timeout, api.get_opt(name)).await {
        Ok(Ok(current)) => current,
        Ok(Err(error)) => {
            warn!(lease = %name, %error, "cannot read the lease");
            return Attempt::Unsure;
        }
        Err(_) => {
            warn!(lease = %name, ?timeout, "cannot read the lease: no answer within the lease request timeout");
            return Attempt::Unsure;
        }
    };
    let now = Instant::now();
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
    let sent = Instant::now();
    let written = match (step, current) {
        (Step::Follow { holder }, _) => return Attempt::Follows { holder },
        (Step::Create, _) => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.to_owned()),
                    owner_references: owner.map(|owner| vec![owner.clone()]),
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
            tokio::time::timeout(timeout, api.create(&PostParams::default(), &lease)).await
        }
        (step, Some(mut lease)) => {
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            if step == Step::TakeOver {
                spec.holder_identity = Some(identity.to_owned());
                spec.acquire_time = Some(stamp.clone());
                spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                // The Lease goes with its holder's Pod: the previous holder's ownership goes.
                lease.metadata.owner_references = owner.map(|owner| vec![owner.clone()]);
            }
            spec.lease_duration_seconds = Some(duration_seconds);
            spec.renew_time = Some(stamp);
            // `replace` sends the resourceVersion we read: a rival's write in between makes this a 409.
            tokio::time::timeout(timeout, api.replace(name, &PostParams::default(), &lease)).await
        }
        (Step::Renew | Step::TakeOver, None) => return Attempt::Unsure,
    };
    match written {
        Ok(Ok(lease)) => {
            *seen = Some((lease.metadata.resource_version, Instant::now()));
            Attempt::Held { sent }
        }
        Ok(Err(kube::Error::Api(status))) if status.code == 409 => Attempt::Unsure,
        Ok(Err(error)) => {
            warn!(lease = %name, %error, "cannot write the lease");
            Attempt::Unsure
        }
        Err(_) => {
            warn!(lease = %name, ?timeout, "cannot write the lease: no answer within the lease request timeout");
            Attempt::Unsure
        }
    }
}

/// Gives the lease up so that another replica takes over at once, as client-go's `ReleaseOnCancel` does,
/// by deleting it: a waiting replica finds no Lease and creates it as soon as it would claim a released
/// one, and a stopping operator that is being uninstalled leaves no Lease behind. The delete is
/// conditional on the uid and resourceVersion read, so a Lease another replica took meanwhile stays.
async fn release(api: &Api<Lease>, name: &str, identity: &str, timeout: Duration) {
    let Ok(Ok(Some(lease))) = tokio::time::timeout(timeout, api.get_opt(name)).await else {
        return;
    };
    let holder = lease.spec.as_ref().and_then(|s| s.holder_identity.as_deref());
    if holder != Some(identity) {
        return;
    }
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: lease.metadata.uid.clone(),
            resource_version: lease.metadata.resource_version.clone(),
        }),
        ..DeleteParams::default()
    };
    match tokio::time::timeout(timeout, api.delete(name, &params)).await {
        Ok(Ok(_)) => info!(lease = %name, %identity, "released the lease (deleted it)"),
        Ok(Err(error)) => warn!(lease = %name, %error, "cannot release the lease"),
        Err(_) => {
            warn!(lease = %name, ?timeout, "cannot release the lease: no answer within the lease request timeout")
        }
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

    #[test]
    fn timings_that_could_let_two_replicas_write_are_refused() {
        let timing = Timing::default()
            .validate()
            .expect("client-go's defaults are valid");
        assert!(timing.request_timeout() < timing.renew_deadline);
        let secs = Duration::from_secs;
        let refused = |lease, renew, retry| {
            Timing {
                lease_duration: lease,
                renew_deadline: renew,
                retry_period: retry,
            }
            .validate()
            .expect_err("refused")
            .to_string()
        };
        let error = refused(secs(15), secs(15), secs(2));
        assert!(
            error.contains("renew deadline 15s must be shorter than the lease duration 15s"),
            "{error}"
        );
        let error = refused(secs(15), secs(10), secs(10));
        assert!(
            error.contains("retry period 10s must be positive and shorter than the renew deadline 10s"),
            "{error}"
        );
        assert!(refused(secs(15), secs(10), Duration::ZERO).contains("retry period 0ns"));
        let error = refused(Duration::from_millis(1500), secs(1), Duration::from_millis(200));
        assert!(
            error.contains("lease duration 1.5s must be a whole number of seconds"),
            "{error}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn leadership_ends_at_its_deadline_even_when_nobody_says_so() {
        let start = Instant::now();
        let (sender, receiver) = watch::channel(Term::Until(start + Duration::from_secs(10)));
        let mut leadership = Leadership {
            receiver,
            seen: None,
            _fixed: None,
        };
        assert_eq!(leadership.check(), Ok(()));
        assert_eq!(leadership.time_left(), Some(Duration::from_secs(10)));
        tokio::time::advance(Duration::from_millis(9_999)).await;
        assert!(leadership.is_leader(), "still within the renew deadline");
        // The election task is stuck (its sender is alive and silent): the clock alone ends the leadership.
        let leading = leadership.changed().await;
        assert!(!leading);
        assert_eq!(start.elapsed(), Duration::from_secs(10));
        assert_eq!(leadership.check(), Err(NotLeader));
        assert_eq!(leadership.time_left(), Some(Duration::ZERO));
        // A renewal that starts a new term wakes the waiters.
        let waiter = tokio::spawn(async move { leadership.changed().await });
        tokio::task::yield_now().await;
        sender.send_replace(Term::Until(Instant::now() + Duration::from_secs(10)));
        assert!(waiter.await.expect("joins"));
        drop(sender);
        assert!(Leadership::always().is_leader());
        assert_eq!(Leadership::always().time_left(), None);
    }

    /// A controller runs a pass between two waits; a leadership lost and won again meanwhile, or a deadline
    /// that passed meanwhile, is reported by the next wait instead of being lost until the next resync.
    #[tokio::test(start_paused = true)]
    async fn a_change_while_the_caller_was_busy_is_reported_by_the_next_wait() {
        let (set, mut leadership) = Leadership::for_tests();
        set(Some(Duration::from_secs(10)));
        let wait = |leadership: &mut Leadership| {
            let mut leadership = leadership.clone();
            async move {
                let answer = tokio::time::timeout(Duration::from_millis(1), leadership.changed()).await;
                (answer, leadership)
            }
        };
        let (started, mut leadership_after) = wait(&mut leadership).await;
        assert_eq!(started, Ok(true), "the start of leadership");
        let (quiet, after) = wait(&mut leadership_after).await;
        assert!(quiet.is_err(), "leading, and nothing changes");
        leadership = after;
        // Busy in a pass: the deadline passes unannounced.
        tokio::time::advance(Duration::from_secs(11)).await;
        let (lost, after) = wait(&mut leadership).await;
        assert_eq!(lost, Ok(false), "the deadline that passed while busy");
        leadership = after;
        set(Some(Duration::from_secs(10)));
        let (won, after) = wait(&mut leadership).await;
        assert_eq!(won, Ok(true), "leading again");
        leadership = after;
        // Busy again: the leadership ends and starts again; the answer is the same, but a pass is due.
        set(None);
        set(Some(Duration::from_secs(10)));
        let (again, _) = wait(&mut leadership).await;
        assert_eq!(again, Ok(true), "lost and won again while busy");
    }

    /// Two replicas elect on the fake server; the leader's lease requests then hang. Sampled every 100 ms
    /// of (paused) time, the two never lead at once, the old leader stops within the renew deadline of its
    /// last renewal and the new one starts only after the lease duration.
    #[tokio::test(start_paused = true)]
    async fn a_leader_whose_lease_requests_hang_stops_before_another_takes_over() {
        use gpuop_fakeserver::{FakeServer, Faults};
        let server = FakeServer::new();
        let timing = Timing::default();
        let shutdown = tokio_util::sync::CancellationToken::new();
        let replica = |identity: &str| {
            let api: Api<Lease> = Api::namespaced(server.client_as(identity), "default");
            elect(
                api,
                "lease".into(),
                identity.into(),
                None,
                timing,
                shutdown.clone(),
            )
        };
        let (mut a, _a_task) = replica("replica-a");
        a.until_leader().await;
        let (b, _b_task) = replica("replica-b");
        tokio::time::sleep(timing.lease_duration * 2).await;
        assert!(a.is_leader() && !b.is_leader(), "a renews, b follows");

        let hung = Instant::now();
        server.set_faults(Faults::new(0).hang(None, Some("leases"), Some("replica-a")));
        let step = Duration::from_millis(100);
        let mut a_stopped = None;
        let b_started = loop {
            tokio::time::sleep(step).await;
            assert!(
                !(a.is_leader() && b.is_leader()),
                "two leaders {:?} after a's lease requests began to hang",
                hung.elapsed()
            );
            if !a.is_leader() {
                a_stopped.get_or_insert_with(Instant::now);
            }
            if b.is_leader() {
                break Instant::now();
            }
            assert!(hung.elapsed() < Duration::from_secs(60), "b never took over");
        };
        let a_stopped = a_stopped.expect("a stopped before b started");
        // a's last renewal was sent at most one retry period before the hang began.
        assert!(
            a_stopped.duration_since(hung) <= timing.renew_deadline + step,
            "a wrote for {:?} after its renewals began to hang",
            a_stopped.duration_since(hung)
        );
        assert!(
            b_started.duration_since(a_stopped) >= timing.lease_duration - timing.renew_deadline - step,
            "a stopped only {:?} before b started",
            b_started.duration_since(a_stopped)
        );
        shutdown.cancel();
    }
}
