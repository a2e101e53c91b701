//! Conformance of the fake API server, driven through `kube::Api`, kube-runtime's `watcher` and
//! `Controller`, and the router as a plain `tower::Service`: what kube-runtime and kubectl rely on a real API
//! server to do, checked against this one; and its robustness: kube-apiserver's refusals replayed from a
//! corpus, property tests and an in-process fuzz target over the HTTP front end.

mod conformance {
    pub mod support;

    mod apply;
    mod crd;
    mod crud;
    mod faults;
    mod fields;
    mod fuzz;
    mod gc;
    mod http;
    mod limits;
    mod list;
    mod rbac;
    mod robustness;
    mod status;
    mod table;
    mod watch;
}
