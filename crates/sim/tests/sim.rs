//! Integration tests of the simulated cluster, one binary with a module per concern:
//! - `kubectl`: `gpu-sim serve` driven by the real kubectl;
//! - `scenarios`: the simulator's actors on the fake API server, driven by hand-written objects and faults;
//! - `operator`: the operator converging simulated clusters (controller-level tests of issue 5).

#[path = "sim/kubectl.rs"]
mod kubectl;
#[path = "sim/operator.rs"]
mod operator;
#[path = "sim/scenarios.rs"]
mod scenarios;
