//! Faults injected on purpose, deterministically from a seed: errors at a rate per verb and resource (500,
//! 429 with `Retry-After`, 409), added latency, requests never answered (a hung server, as one client sees
//! it), watch events of a resource delivered late (a lagging informer cache), and watch streams that end
//! after N events. A rule may be limited to one client (the `User-Agent`'s product, as accounting counts it). Forced compaction is
//! [`FakeServer::compact`](crate::FakeServer::compact).
//!
//! Each rule keeps its own count of the requests it matched, and whether the n-th one fails is a hash of
//! (seed, rule, n): the same client doing the same thing meets the same faults, whatever else runs.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use crate::accounting::{Verb, client_matches};
use crate::error::{ApiError, GroupResource};
use crate::random::mix;

/// The error an injected fault answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InjectedError {
    /// 500 InternalError.
    Internal,
    /// 429 TooManyRequests with `Retry-After`.
    TooManyRequests {
        /// The `Retry-After` seconds.
        retry_after_seconds: u64,
    },
    /// 409 Conflict, as if the object had been modified.
    Conflict,
}

impl InjectedError {
    /// The HTTP code.
    pub fn code(self) -> u16 {
        match self {
            Self::Internal => 500,
            Self::TooManyRequests { .. } => 429,
            Self::Conflict => 409,
        }
    }

    pub(crate) fn to_api_error(self, resource: GroupResource, name: &str) -> ApiError {
        match self {
            Self::Internal => ApiError::Internal("Internal error occurred: injected fault".into()),
            Self::TooManyRequests { retry_after_seconds } => ApiError::TooManyRequests {
                message: "Too many requests, please try again later. (injected fault)".into(),
                retry_after_seconds: Some(retry_after_seconds),
                causes: Vec::new(),
            },
            Self::Conflict => ApiError::Conflict {
                resource,
                name: name.to_owned(),
                detail: "the object has been modified; please apply your changes to the latest version and try again \
                         (injected fault)"
                    .into(),
            },
        }
    }
}

/// What a matching rule does.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Effect {
    /// Answer this error instead of serving the request.
    Error(InjectedError),
    /// Serve the request after this delay.
    Latency(Duration),
    /// Deliver watch events of the rule's resource this long after the change; requests are not touched.
    WatchDelay(Duration),
    /// Never answer, and never serve, the request: the client sees a server that hangs.
    Hang,
}

/// One fault: which requests it hits, how often, and what it does.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultRule {
    /// Only this verb (any when `None`).
    pub verb: Option<Verb>,
    /// Only this plural resource (any when `None`).
    pub resource: Option<String>,
    /// Only requests of this client: its `User-Agent`'s first word, or that word's product token
    /// (`gpu-operator-rs` matches `gpu-operator-rs/0.1.0`); any client when `None`.
    pub client: Option<String>,
    /// Only requests that came through the listener of this name
    /// ([`FakeServer::serve_as`](crate::FakeServer::serve_as)); any listener when `None`.
    pub listener: Option<String>,
    /// The share of matching requests hit, 0.0 to 1.0.
    pub rate: f64,
    /// What happens to a hit request.
    pub effect: Effect,
}

impl FaultRule {
    fn matches(&self, verb: Verb, resource: &str, client: &str, listener: &str) -> bool {
        self.listener.as_deref().is_none_or(|wanted| wanted == listener)
            && self.verb.is_none_or(|v| v == verb)
            && self.resource.as_deref().is_none_or(|r| r == resource)
            && self
                .client
                .as_deref()
                .is_none_or(|wanted| client_matches(client, wanted))
    }
}

/// A fault rule that could not be parsed from its command-line form.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid fault {text:?}: {problem}; expected e.g. \"verb=patch,resource=nodes,rate=0.1,code=429,retry-after=2\", \"verb=list,client=gpu-operator-rs,latency-ms=50\", \"resource=leases,client=replica-a,hang\" or \"resource=nodes,watch-delay-ms=3000\""
)]
pub struct FaultParseError {
    text: String,
    problem: String,
}

impl FromStr for FaultRule {
    type Err = FaultParseError;

    /// `verb=V,resource=R,client=C,rate=F,code=500|429|409[,retry-after=S]`, `...,latency-ms=MS`,
    /// `...,hang`, or `resource=R,watch-delay-ms=MS`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let fail = |problem: String| FaultParseError {
            text: text.to_owned(),
            problem,
        };
        let (mut verb, mut resource, mut rate, mut code, mut retry, mut latency) =
            (None, None, None, None, 1, None);
        let (mut watch_delay, mut client, mut hang) = (None, None, false);
        let mut listener = None;
        for part in text.split(',').filter(|p| !p.is_empty()) {
            if part.trim() == "hang" {
                hang = true;
                continue;
            }
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| fail(format!("{part:?} is not key=value")))?;
            match key.trim() {
                "verb" => {
                    verb = Some(Verb::parse(value).ok_or_else(|| fail(format!("unknown verb {value:?}")))?)
                }
                "resource" => resource = Some(value.to_owned()),
                "client" => client = Some(value.to_owned()),
                "listener" => listener = Some(value.to_owned()),
                "rate" => {
                    rate = Some(
                        value
                            .parse::<f64>()
                            .ok()
                            .filter(|r| (0.0..=1.0).contains(r))
                            .ok_or_else(|| fail(format!("rate {value:?} is not a number from 0 to 1")))?,
                    );
                }
                "code" => {
                    code = Some(
                        value
                            .parse::<u16>()
                            .map_err(|_| fail(format!("code {value:?} is not a number")))?,
                    )
                }
                "retry-after" => {
                    retry = value
                        .parse()
                        .map_err(|_| fail(format!("retry-after {value:?} is not whole seconds")))?;
                }
                "latency-ms" => {
                    latency = Some(
                        value
                            .parse()
                            .map_err(|_| fail(format!("latency-ms {value:?} is not a number")))?,
                    );
                }
                "watch-delay-ms" => {
                    watch_delay =
                        Some(value.parse().map_err(|_| {
                            fail(format!("watch-delay-ms {value:?} is not whole milliseconds"))
                        })?);
                }
                other => return Err(fail(format!("unknown key {other:?}"))),
            }
        }
        if let Some(ms) = watch_delay {
            if client.is_some() || hang {
                return Err(fail("give watch-delay-ms alone, not with client or hang".into()));
            }
            // A delay applies to every watch event of one resource: a verb, rate or second effect would
            // suggest a selectivity it does not have.
            if client.is_some() || listener.is_some() {
                return Err(fail(
                    "watch-delay-ms delays every watcher's events; leave out client and listener".into(),
                ));
            }
            return match (resource, verb, rate, code, latency) {
                (None, ..) => Err(fail("watch-delay-ms needs resource=<plural>".into())),
                (_, Some(_), ..) => Err(fail("watch-delay-ms applies to watches; leave out verb".into())),
                (_, _, Some(_), ..) => Err(fail("watch-delay-ms delays every event; leave out rate".into())),
                (_, _, _, Some(_), _) | (_, _, _, _, Some(_)) => Err(fail(
                    "give watch-delay-ms alone, not with code or latency-ms".into(),
                )),
                (Some(resource), None, None, None, None) => Ok(Self {
                    verb: None,
                    resource: Some(resource),
                    client: None,
                    listener: None,
                    rate: 1.0,
                    effect: Effect::WatchDelay(Duration::from_millis(ms)),
                }),
            };
        }
        let rate = rate.unwrap_or(1.0);
        let effect = match (code, latency) {
            _ if hang && (code.is_some() || latency.is_some()) => {
                return Err(fail("give hang alone, not with code or latency-ms".into()));
            }
            _ if hang => Effect::Hang,
            (Some(500), None) => Effect::Error(InjectedError::Internal),
            (Some(429), None) => Effect::Error(InjectedError::TooManyRequests {
                retry_after_seconds: retry,
            }),
            (Some(409), None) => Effect::Error(InjectedError::Conflict),
            (Some(other), None) => return Err(fail(format!("code {other} is not one of 500, 429, 409"))),
            (None, Some(ms)) => Effect::Latency(Duration::from_millis(ms)),
            (Some(_), Some(_)) => return Err(fail("give either code or latency-ms, not both".into())),
            (None, None) => return Err(fail("give code, latency-ms, hang or watch-delay-ms".into())),
        };
        Ok(Self {
            verb,
            resource,
            client,
            listener,
            rate,
            effect,
        })
    }
}

/// A set of faults, built up and handed to [`FakeServer::set_faults`](crate::FakeServer::set_faults).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Faults {
    seed: u64,
    rules: Vec<FaultRule>,
    drop_watches_after: Option<usize>,
}

impl Faults {
    /// No faults yet, deciding hits from `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            ..Self::default()
        }
    }

    /// Fails a share of the matching requests with `error`.
    #[must_use]
    pub fn error(
        mut self,
        verb: Option<Verb>,
        resource: Option<&str>,
        rate: f64,
        error: InjectedError,
    ) -> Self {
        self.rules.push(FaultRule {
            verb,
            resource: resource.map(str::to_owned),
            client: None,
            listener: None,
            rate,
            effect: Effect::Error(error),
        });
        self
    }

    /// Delays every matching request.
    #[must_use]
    pub fn latency(mut self, verb: Option<Verb>, resource: Option<&str>, delay: Duration) -> Self {
        self.rules.push(FaultRule {
            verb,
            resource: resource.map(str::to_owned),
            client: None,
            listener: None,
            rate: 1.0,
            effect: Effect::Latency(delay),
        });
        self
    }

    /// Never answers the matching requests of `client` (any client when `None`): to that client the
    /// server hangs, while it serves everyone else. Nothing of a hung request is served or counted.
    #[must_use]
    pub fn hang(mut self, verb: Option<Verb>, resource: Option<&str>, client: Option<&str>) -> Self {
        self.rules.push(FaultRule {
            verb,
            resource: resource.map(str::to_owned),
            client: client.map(str::to_owned),
            listener: None,
            rate: 1.0,
            effect: Effect::Hang,
        });
        self
    }

    /// Adds a rule.
    #[must_use]
    pub fn rule(mut self, rule: FaultRule) -> Self {
        self.rules.push(rule);
        self
    }

    /// Delivers every watch event of objects of the plural `resource` `delay` after the change, in order,
    /// on every watch stream of it: what a lagging informer cache sees. Writes are acknowledged at once and
    /// GETs and LISTs see them at once; bookmarks never claim a version past an event not yet delivered.
    #[must_use]
    pub fn delay_watch_events(mut self, resource: &str, delay: Duration) -> Self {
        self.rules.push(FaultRule {
            verb: None,
            resource: Some(resource.to_owned()),
            client: None,
            listener: None,
            rate: 1.0,
            effect: Effect::WatchDelay(delay),
        });
        self
    }

    /// Ends every watch stream after it has sent `events` object events (bookmarks do not count).
    #[must_use]
    pub fn drop_watches_after(mut self, events: usize) -> Self {
        self.drop_watches_after = Some(events);
        self
    }
}

impl fmt::Display for FaultRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verb = self.verb.map_or("any".to_owned(), |v| v.to_string());
        write!(
            f,
            "{verb} {} of {} at rate {}: {:?}",
            self.resource.as_deref().unwrap_or("any"),
            self.client.as_deref().unwrap_or("any client"),
            self.rate,
            self.effect
        )
    }
}

/// What the injector decided for one request.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Decision {
    pub(crate) latency: Duration,
    pub(crate) error: Option<InjectedError>,
    /// Never answer.
    pub(crate) hang: bool,
}

#[derive(Debug, Default)]
struct Active {
    faults: Faults,
    counters: Vec<AtomicU64>,
}

/// The faults in force, shared by all requests and by open watch streams.
#[derive(Debug, Default)]
pub(crate) struct FaultInjector(Arc<RwLock<Active>>);

/// The watch delay of one resource, read at each event so that [`FakeServer::set_faults`]
/// (crate::FakeServer::set_faults) reaches streams already open.
#[derive(Clone, Debug)]
pub(crate) struct WatchDelay {
    active: Arc<RwLock<Active>>,
    resource: String,
}

impl WatchDelay {
    /// The delay in force now (zero when none).
    pub(crate) fn current(&self) -> Duration {
        let active = self.active.read().unwrap_or_else(PoisonError::into_inner);
        active
            .faults
            .rules
            .iter()
            .filter(|rule| rule.resource.as_deref().is_none_or(|r| r == self.resource))
            .filter_map(|rule| match rule.effect {
                Effect::WatchDelay(delay) => Some(delay),
                Effect::Error(_) | Effect::Latency(_) | Effect::Hang => None,
            })
            .max()
            .unwrap_or_default()
    }
}

impl FaultInjector {
    pub(crate) fn set(&self, faults: Faults) {
        let counters = faults.rules.iter().map(|_| AtomicU64::new(0)).collect();
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Active { faults, counters };
    }

    pub(crate) fn decide(&self, verb: Verb, resource: &str, client: &str, listener: &str) -> Decision {
        let active = self.0.read().unwrap_or_else(PoisonError::into_inner);
        let mut decision = Decision::default();
        for (index, rule) in active.faults.rules.iter().enumerate() {
            if !rule.matches(verb, resource, client, listener) || matches!(rule.effect, Effect::WatchDelay(_))
            {
                continue;
            }
            let n = active.counters[index].fetch_add(1, Ordering::Relaxed);
            let roll = mix(active.faults.seed ^ ((index as u64) << 40) ^ n) as f64 / u64::MAX as f64;
            if roll >= rule.rate {
                continue;
            }
            match rule.effect {
                Effect::Latency(delay) => decision.latency += delay,
                Effect::Hang => decision.hang = true,
                Effect::WatchDelay(_) => {}
                Effect::Error(error) => {
                    decision.error.get_or_insert(error);
                }
            }
        }
        decision
    }

    /// The handle a watch stream of `resource` reads its delay from.
    pub(crate) fn watch_delay(&self, resource: &str) -> WatchDelay {
        WatchDelay {
            active: self.0.clone(),
            resource: resource.to_owned(),
        }
    }

    pub(crate) fn drop_watches_after(&self) -> Option<usize> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .faults
            .drop_watches_after
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rule that `resource=<resource>` and `effect` parse to: every request for the resource is hit.
    fn every_request_for(resource: &str, effect: Effect) -> FaultRule {
        FaultRule {
            verb: None,
            resource: Some(resource.into()),
            client: None,
            listener: None,
            rate: 1.0,
            effect,
        }
    }

    fn hits(faults: Faults, requests: usize) -> Vec<bool> {
        let injector = FaultInjector::default();
        injector.set(faults);
        (0..requests)
            .map(|_| injector.decide(Verb::Patch, "nodes", "a", "").error.is_some())
            .collect()
    }

    #[test]
    fn the_same_seed_fails_the_same_requests() {
        let faults =
            |seed| Faults::new(seed).error(Some(Verb::Patch), Some("nodes"), 0.3, InjectedError::Internal);
        let first = hits(faults(1), 1000);
        assert_eq!(first, hits(faults(1), 1000));
        assert_ne!(first, hits(faults(2), 1000));
        let share = first.iter().filter(|h| **h).count();
        assert!((200..400).contains(&share), "about 30% of 1000, got {share}");
    }

    #[test]
    fn rules_hit_only_their_verb_and_resource() {
        let injector = FaultInjector::default();
        injector.set(Faults::new(0).error(Some(Verb::Patch), Some("nodes"), 1.0, InjectedError::Conflict));
        assert_eq!(
            injector.decide(Verb::Patch, "nodes", "a", "").error,
            Some(InjectedError::Conflict)
        );
        assert_eq!(injector.decide(Verb::Get, "nodes", "a", "").error, None);
        assert_eq!(injector.decide(Verb::Patch, "pods", "a", "").error, None);
    }

    #[test]
    fn rules_with_a_client_hit_only_that_client() {
        let injector = FaultInjector::default();
        injector.set(Faults::new(0).rule(FaultRule {
            verb: None,
            resource: None,
            client: Some("gpu-operator-rs".into()),
            listener: None,
            rate: 1.0,
            effect: Effect::Error(InjectedError::Internal),
        }));
        let hit = |client| injector.decide(Verb::Patch, "nodes", client, "").error;
        assert_eq!(hit("gpu-operator-rs/0.1.0"), Some(InjectedError::Internal));
        assert_eq!(hit("gpu-operator-rs"), Some(InjectedError::Internal));
        assert_eq!(hit("gpu-sim/0.1.0"), None);
        assert_eq!(hit("unknown"), None);
        injector.set(Faults::new(0).rule(FaultRule {
            verb: None,
            resource: None,
            client: None,
            listener: Some("replica-a".into()),
            rate: 1.0,
            effect: Effect::Error(InjectedError::Internal),
        }));
        let through = |listener| injector.decide(Verb::Patch, "nodes", "any", listener).error;
        assert_eq!(through("replica-a"), Some(InjectedError::Internal));
        assert_eq!(through("replica-b"), None);
        assert_eq!(through(""), None, "in-process clients come through no listener");
    }

    #[test]
    fn watch_delays_touch_no_request_and_follow_set_faults() {
        let injector = FaultInjector::default();
        let nodes = injector.watch_delay("nodes");
        assert_eq!(nodes.current(), Duration::ZERO);
        injector.set(Faults::new(0).delay_watch_events("nodes", Duration::from_secs(2)));
        assert_eq!(
            nodes.current(),
            Duration::from_secs(2),
            "an open stream sees new faults"
        );
        assert_eq!(injector.watch_delay("pods").current(), Duration::ZERO);
        assert_eq!(
            injector.decide(Verb::Watch, "nodes", "a", ""),
            Decision::default()
        );
    }

    #[test]
    fn a_hang_hits_only_its_client_verb_and_resource() {
        let injector = FaultInjector::default();
        injector.set(Faults::new(0).hang(Some(Verb::Update), Some("leases"), Some("replica-a")));
        assert!(injector.decide(Verb::Update, "leases", "replica-a", "").hang);
        assert!(
            injector.decide(Verb::Update, "leases", "replica-a/v1", "").hang,
            "the product matches whatever version follows it"
        );
        assert!(!injector.decide(Verb::Update, "leases", "replica-b", "").hang);
        assert!(!injector.decide(Verb::Get, "leases", "replica-a", "").hang);
        assert!(!injector.decide(Verb::Update, "configmaps", "replica-a", "").hang);
        let rule: FaultRule = "resource=leases,client=replica-a,hang".parse().expect("parses");
        assert_eq!(
            rule,
            FaultRule {
                client: Some("replica-a".into()),
                ..every_request_for("leases", Effect::Hang)
            }
        );
        for bad in [
            "resource=leases,hang,code=500",
            "resource=leases,hang,watch-delay-ms=5",
        ] {
            let error = bad.parse::<FaultRule>().expect_err(bad).to_string();
            assert!(error.contains("hang"), "{bad}: {error}");
        }
    }

    #[test]
    fn rules_parse_from_the_command_line() {
        let rule: FaultRule = "verb=patch,resource=nodes,rate=0.5,code=429,retry-after=3"
            .parse()
            .expect("parses");
        assert_eq!(
            rule,
            FaultRule {
                verb: Some(Verb::Patch),
                resource: Some("nodes".into()),
                client: None,
                listener: None,
                rate: 0.5,
                effect: Effect::Error(InjectedError::TooManyRequests {
                    retry_after_seconds: 3
                }),
            }
        );
        let latency: FaultRule = "verb=list,latency-ms=20".parse().expect("parses");
        assert_eq!(latency.effect, Effect::Latency(Duration::from_millis(20)));
        let delay: FaultRule = "resource=nodes,watch-delay-ms=3000".parse().expect("parses");
        assert_eq!(
            delay,
            every_request_for("nodes", Effect::WatchDelay(Duration::from_secs(3)))
        );
        let operator: FaultRule = "client=gpu-operator-rs,code=500".parse().expect("parses");
        assert_eq!(operator.client.as_deref(), Some("gpu-operator-rs"));
        let replica: FaultRule = "listener=replica-a,resource=leases,latency-ms=20000"
            .parse()
            .expect("parses");
        assert_eq!(replica.listener.as_deref(), Some("replica-a"));
        for bad in [
            "watch-delay-ms=3000",
            "resource=nodes,watch-delay-ms=soon",
            "verb=patch,resource=nodes,watch-delay-ms=5",
            "resource=nodes,watch-delay-ms=5,rate=0.5",
            "resource=nodes,watch-delay-ms=5,code=500",
            "resource=nodes,watch-delay-ms=5,client=kubectl",
        ] {
            let error = bad.parse::<FaultRule>().expect_err(bad).to_string();
            assert!(
                error.contains(bad) && error.contains("watch-delay-ms"),
                "{bad}: {error}"
            );
        }
        assert!("code=418".parse::<FaultRule>().is_err());
        assert!("rate=2,code=500".parse::<FaultRule>().is_err());
    }
}
