//! Conformance of the fake API server, driven through `kube::Api`, kube-runtime's `watcher` and
//! `Controller`, and the router as a plain `tower::Service`: what kube-runtime and kubectl rely on a real API
//! server to do, checked against this one.

mod conformance {
    pub mod support;

    mod apply;
    mod crd;
    mod crud;
    mod faults;
    mod fields;
    mod gc;
    mod http;
    mod limits;
    mod list;
    mod rbac;
    mod status;
    mod watch;
}
