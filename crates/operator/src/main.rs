//! `gpu-operator`: see `gpu-operator --help`.

fn main() {
    print!("{}", gpuop_api::crd::crds_yaml());
}
