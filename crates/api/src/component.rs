//! Building blocks every operand section of the CRDs shares: where the image comes from, how it is pulled,
//! and what the container gets (resources, args, env).
//!
//! Every field is optional and serialized only when set, so a manifest survives a parse/serialize round
//! trip unchanged and server-side apply never claims a field nobody wrote.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The pattern NVIDIA's CRD puts on every `image` field.
pub const IMAGE_NAME_PATTERN: &str = r"[a-zA-Z0-9\-]+";

/// Where an operand's container image comes from and how it is pulled.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageSpec {
    /// Registry and path of the image, e.g. `nvcr.io/nvidia`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository: Option<String>,
    /// Image name, e.g. `driver`. Set alone (without repository and version) it is used verbatim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"[a-zA-Z0-9\-]+"))]
    pub image: Option<String>,
    /// Image tag, or a digest starting with `sha256:`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// `Always`, `Never` or `IfNotPresent` (anything else means `IfNotPresent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    /// Names of Secrets in the operator namespace used to pull the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_secrets: Option<Vec<String>>,
}

/// The image reference an [`ImageSpec`] resolves to, or why it resolves to none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImageRef {
    /// Nothing is set: the operator falls back to its environment variable for this image.
    Unset,
    /// A complete reference, `repository/image:version` or `repository/image@sha256:...`.
    Resolved(String),
    /// Some but not all of repository, image and version are set.
    Partial,
}

impl ImageSpec {
    /// Resolves the image reference the way NVIDIA's operator does: the full triple wins, an image alone is
    /// taken verbatim, nothing set means "use the operator's environment", anything else is a mistake.
    pub fn reference(&self) -> ImageRef {
        match (
            non_empty(&self.repository),
            non_empty(&self.image),
            non_empty(&self.version),
        ) {
            (None, None, None) => ImageRef::Unset,
            (None, Some(image), None) => ImageRef::Resolved(image.to_owned()),
            (Some(repository), Some(image), Some(version)) => {
                let separator = if version.starts_with("sha256:") { '@' } else { ':' };
                ImageRef::Resolved(format!("{repository}/{image}{separator}{version}"))
            }
            _ => ImageRef::Partial,
        }
    }

    /// The pull policy NVIDIA's operator applies: unknown or absent values mean `IfNotPresent`.
    pub fn pull_policy(&self) -> &'static str {
        match self.image_pull_policy.as_deref() {
            Some("Always") => "Always",
            Some("Never") => "Never",
            _ => "IfNotPresent",
        }
    }
}

/// An environment variable with a literal value (`valueFrom` is not supported by these CRDs).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EnvVar {
    /// Name of the variable.
    pub name: String,
    /// Value of the variable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

impl EnvVar {
    /// A variable with a value.
    pub fn new(name: impl Into<String>, value: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            value: Some(value.into()),
        }
    }
}

/// Compute resources for an operand's containers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ResourceRequirements {
    /// Maximum resources allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<BTreeMap<String, Quantity>>,
    /// Minimum resources requested.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<BTreeMap<String, Quantity>>,
}

/// What an operand's container gets besides its image: resources, arguments, environment, host network.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainerSpec {
    /// Compute resources for the operand's containers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Extra arguments for the main container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,
    /// Extra environment variables for the main container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Vec<EnvVar>>,
    /// Run the operand's pods in the host network namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_network: Option<bool>,
}

/// The common shape of most operand sections: an `enabled` switch, an image and a container.
///
/// Whether an absent `enabled` means on or off differs per operand; the operand's own type says so through
/// its `is_enabled` method.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComponentSpec {
    /// Deploy this operand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// The operand's image.
    #[serde(flatten)]
    pub image: ImageSpec,
    /// The operand's container settings.
    #[serde(flatten)]
    pub container: ContainerSpec,
}

impl ComponentSpec {
    /// `enabled`, or `default` when the field is absent.
    pub fn enabled_or(&self, default: bool) -> bool {
        self.enabled.unwrap_or(default)
    }
}

/// A single name referring to a ConfigMap or Secret in the operator namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct NameRef {
    /// Name of the object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl NameRef {
    /// The name when it is set and non-empty.
    pub fn get(&self) -> Option<&str> {
        self.name.as_deref().filter(|name| !name.is_empty())
    }
}

/// A ConfigMap name plus the key used on nodes that do not pick one with a label.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct NamedConfig {
    /// Name of the ConfigMap in the operator namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Key of the ConfigMap used when a node does not select one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
}

/// The string when it is set and not empty.
pub(crate) fn non_empty(field: &Option<String>) -> Option<&str> {
    field.as_deref().filter(|s| !s.is_empty())
}

/// Returns the value of an optional flag, `default` when absent.
pub(crate) fn flag(value: Option<bool>, default: bool) -> bool {
    value.unwrap_or(default)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(repository: Option<&str>, image: Option<&str>, version: Option<&str>) -> ImageSpec {
        ImageSpec {
            repository: repository.map(str::to_owned),
            image: image.map(str::to_owned),
            version: version.map(str::to_owned),
            ..ImageSpec::default()
        }
    }

    #[test]
    fn image_reference_follows_nvidia_precedence() {
        let cases = [
            (spec(None, None, None), ImageRef::Unset),
            (spec(Some(""), Some(""), Some("")), ImageRef::Unset),
            (
                spec(None, Some("registry/x:1"), None),
                ImageRef::Resolved("registry/x:1".into()),
            ),
            (
                spec(Some("nvcr.io/nvidia"), Some("driver"), Some("595.91.07")),
                ImageRef::Resolved("nvcr.io/nvidia/driver:595.91.07".into()),
            ),
            (
                spec(Some("nvcr.io/nvidia"), Some("driver"), Some("sha256:abcd")),
                ImageRef::Resolved("nvcr.io/nvidia/driver@sha256:abcd".into()),
            ),
            (
                spec(Some("nvcr.io/nvidia"), Some("driver"), None),
                ImageRef::Partial,
            ),
            (spec(Some("nvcr.io/nvidia"), None, Some("1")), ImageRef::Partial),
            (spec(None, Some("driver"), Some("1")), ImageRef::Partial),
        ];
        for (spec, expected) in cases {
            assert_eq!(spec.reference(), expected, "{spec:?}");
        }
    }

    #[test]
    fn unknown_pull_policy_means_if_not_present() {
        for (given, expected) in [
            (None, "IfNotPresent"),
            (Some("Always"), "Always"),
            (Some("Never"), "Never"),
            (Some("IfNotPresent"), "IfNotPresent"),
            (Some("always"), "IfNotPresent"),
        ] {
            let spec = ImageSpec {
                image_pull_policy: given.map(str::to_owned),
                ..ImageSpec::default()
            };
            assert_eq!(spec.pull_policy(), expected);
        }
    }
}
