//! Image sections of the policy and driver image tags.
//!
//! Images themselves are resolved by validation (`ValidatedPolicy::image`), and a section's other settings
//! are `gpuop_api::ImageSection`'s; this module builds the OS-specific driver tags:
//! `<image>-<osTag>` for driver, GPUDirect Storage, GDRCopy and vGPU manager images, and
//! `<image>-<kernel>-<osTag>` for precompiled drivers. A digest gets no suffix.

use gpuop_api::ImageSection;

use crate::{OsPool, RenderError};

/// The OS part of driver image tags: `<ID><VERSION_ID>`, with only the major version for RHEL, Rocky Linux
/// and Oracle Linux (`rhel9`, `ubuntu22.04`), as NVIDIA publishes its driver images.
pub fn os_tag(os_id: &str, os_version: &str) -> String {
    match os_id {
        "rhel" | "rocky" | "ol" => {
            let major = os_version.split('.').next().unwrap_or(os_version);
            format!("{os_id}{major}")
        }
        _ => format!("{os_id}{os_version}"),
    }
}

/// A kernel version as it appears in precompiled driver DaemonSet names: without the architecture (images
/// are multi-arch), `_` turned into `.`, no trailing `.`, lower case (`5.14.0-427.el9_4.x86_64` becomes
/// `5.14.0-427.el9.4`).
pub fn sanitized_kernel(kernel: &str) -> String {
    let mut text = kernel.to_owned();
    for arch in ["x86_64_64k", "x86_64", "aarch64_64k", "aarch64"] {
        text = text.replace(arch, "");
    }
    text.replace('_', ".").trim_end_matches('.').to_lowercase()
}

/// Whether a resolved image reference is pinned by digest (NVIDIA appends no tag suffix then).
pub(crate) fn is_digest(image: &str) -> bool {
    image.contains("sha256:")
}

/// The OS tag of a pool, or why it has none.
pub(crate) fn pool_os_tag(pool: &OsPool, section: ImageSection) -> Result<String, RenderError> {
    if pool.os_id.is_empty() || pool.os_version.is_empty() {
        return Err(RenderError::PoolWithoutOs {
            section,
            os_id: pool.os_id.clone(),
            os_version: pool.os_version.clone(),
        });
    }
    Ok(os_tag(&pool.os_id, &pool.os_version))
}

/// `<image>-<osTag>`, or the image unchanged when it is a digest.
pub(crate) fn with_os_suffix(image: &str, os_tag: &str) -> String {
    if is_digest(image) {
        image.to_owned()
    } else {
        format!("{image}-{os_tag}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_tag_keeps_only_the_major_version_for_rhel_rocky_and_oracle() {
        assert_eq!(os_tag("ubuntu", "22.04"), "ubuntu22.04");
        assert_eq!(os_tag("rhel", "9.4"), "rhel9");
        assert_eq!(os_tag("rocky", "8.10"), "rocky8");
        assert_eq!(os_tag("ol", "9.3"), "ol9");
        assert_eq!(os_tag("rhcos", "4.16"), "rhcos4.16");
        assert_eq!(os_tag("sles", "15.6"), "sles15.6");
    }

    #[test]
    fn kernels_lose_their_architecture_and_underscores() {
        assert_eq!(sanitized_kernel("5.15.0-105-generic"), "5.15.0-105-generic");
        assert_eq!(
            sanitized_kernel("5.14.0-427.13.1.el9_4.x86_64"),
            "5.14.0-427.13.1.el9.4"
        );
        assert_eq!(sanitized_kernel("6.1.0-13-AARCH64"), "6.1.0-13-aarch64");
        assert_eq!(sanitized_kernel("5.14.0-70.el9.aarch64_64k"), "5.14.0-70.el9");
    }

    #[test]
    fn digests_get_no_os_suffix() {
        assert_eq!(
            with_os_suffix("nvcr.io/nvidia/driver:595.91.07", "rhel9"),
            "nvcr.io/nvidia/driver:595.91.07-rhel9"
        );
        assert_eq!(
            with_os_suffix("nvcr.io/nvidia/driver@sha256:abcd", "rhel9"),
            "nvcr.io/nvidia/driver@sha256:abcd"
        );
    }

    #[test]
    fn pools_without_os_labels_are_refused() {
        let pool = OsPool {
            os_id: "ubuntu".into(),
            os_version: String::new(),
            kernel: None,
        };
        assert!(matches!(
            pool_os_tag(&pool, ImageSection::Driver),
            Err(RenderError::PoolWithoutOs { .. })
        ));
    }
}
