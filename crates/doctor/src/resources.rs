//! Resource quantities: what a node advertises (capacity, allocatable) and what a pod asks for, with
//! Kubernetes' quantity syntax (`8`, `500m`, `16Gi`, `1e3`).

use std::collections::BTreeMap;

use gpuop_api::labels::is_gpu_resource;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::snapshot::{ContainerFacts, PodFacts};

/// Parses a quantity into thousandths of a unit, rounding up as Kubernetes does; `None` when it does not
/// parse or does not fit.
pub fn parse_milli(text: &str) -> Option<i128> {
    let text = text.trim();
    let (negative, text) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let number_end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(number_end);
    if number.is_empty() || number == "." || number.matches('.').count() > 1 {
        return None;
    }
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let digits = format!("{whole}{fraction}");
    let mut numerator: i128 = digits.parse().ok()?;
    let mut denominator: i128 = 10_i128.checked_pow(u32::try_from(fraction.len()).ok()?)?;
    let ten = |power: i32| 10_i128.checked_pow(power.unsigned_abs());
    let (scale_up, scale_down): (i128, i128) = match suffix {
        "" => (1, 1),
        "n" => (1, ten(9)?),
        "u" => (1, ten(6)?),
        "m" => (1, 1000),
        "k" => (ten(3)?, 1),
        "M" => (ten(6)?, 1),
        "G" => (ten(9)?, 1),
        "T" => (ten(12)?, 1),
        "P" => (ten(15)?, 1),
        "E" => (ten(18)?, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        exponent => {
            let power: i32 = exponent.strip_prefix(['e', 'E'])?.parse().ok()?;
            if power >= 0 {
                (ten(power)?, 1)
            } else {
                (1, ten(power)?)
            }
        }
    };
    numerator = numerator.checked_mul(scale_up)?.checked_mul(1000)?;
    denominator = denominator.checked_mul(scale_down)?;
    let milli = (numerator + denominator - 1) / denominator;
    Some(if negative { -milli } else { milli })
}

/// A quantity in whole units, rounded down (extended resources such as GPUs are whole numbers).
pub fn whole(quantity: &Quantity) -> Option<i64> {
    i64::try_from(parse_milli(&quantity.0)?.div_euclid(1000)).ok()
}

/// Which side of a node's resources to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// What the node has.
    Capacity,
    /// What pods may use (capacity less reservations and unhealthy devices).
    Allocatable,
}

/// The GPU resources (`nvidia.com/gpu`, `nvidia.com/mig-*`, ...) a node reports on one side, non-zero only.
pub fn node_gpu_resources(node: &Node, side: Side) -> BTreeMap<String, i64> {
    let Some(status) = node.status.as_ref() else {
        return BTreeMap::new();
    };
    let map = match side {
        Side::Capacity => status.capacity.as_ref(),
        Side::Allocatable => status.allocatable.as_ref(),
    };
    map.into_iter()
        .flatten()
        .filter(|(name, _)| is_gpu_resource(name))
        .filter_map(|(name, quantity)| Some((name.clone(), whole(quantity)?)))
        .filter(|(_, count)| *count > 0)
        .collect()
}

/// One resource of a node, in thousandths.
pub fn node_resource_milli(node: &Node, side: Side, resource: &str) -> Option<i128> {
    let status = node.status.as_ref()?;
    let map = match side {
        Side::Capacity => status.capacity.as_ref(),
        Side::Allocatable => status.allocatable.as_ref(),
    }?;
    parse_milli(&map.get(resource)?.0)
}

/// What a pod asks for, per resource in thousandths: the larger of its containers' sum and its largest init
/// container, as the scheduler counts it. A limit without a request counts as the request.
pub fn pod_requests(pod: &PodFacts) -> BTreeMap<String, i128> {
    let mut total = BTreeMap::new();
    for container in &pod.spec.containers {
        for (name, milli) in container_requests(container) {
            *total.entry(name).or_insert(0) += milli;
        }
    }
    for container in &pod.spec.init_containers {
        for (name, milli) in container_requests(container) {
            let entry = total.entry(name).or_insert(0);
            *entry = (*entry).max(milli);
        }
    }
    total
}

fn container_requests(container: &ContainerFacts) -> BTreeMap<String, i128> {
    let mut requests = BTreeMap::new();
    let Some(resources) = container.resources.as_ref() else {
        return requests;
    };
    for (name, quantity) in resources.limits.iter().flatten() {
        if let Some(milli) = parse_milli(&quantity.0) {
            requests.insert(name.clone(), milli);
        }
    }
    for (name, quantity) in resources.requests.iter().flatten() {
        if let Some(milli) = parse_milli(&quantity.0) {
            requests.insert(name.clone(), milli);
        }
    }
    requests
}

/// The GPU resources a pod asks for, in whole units, non-zero only.
pub fn pod_gpu_requests(pod: &PodFacts) -> BTreeMap<String, i64> {
    pod_requests(pod)
        .into_iter()
        .filter(|(name, _)| is_gpu_resource(name))
        .filter_map(|(name, milli)| Some((name, i64::try_from(milli.div_euclid(1000)).ok()?)))
        .filter(|(_, count)| *count > 0)
        .collect()
}

/// Formats thousandths of a resource the way a person reads them: `500m`, `2`, `16Gi` for memory.
pub fn format_milli(resource: &str, milli: i128) -> String {
    if resource == "memory" || resource.ends_with("storage") {
        let bytes = milli / 1000;
        for (suffix, size) in [("Gi", 1_i128 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)] {
            if bytes >= size && bytes % size == 0 {
                return format!("{}{suffix}", bytes / size);
            }
        }
        return bytes.to_string();
    }
    if milli % 1000 == 0 {
        (milli / 1000).to_string()
    } else {
        format!("{milli}m")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_like_kubernetes() {
        assert_eq!(parse_milli("8"), Some(8000));
        assert_eq!(parse_milli("500m"), Some(500));
        assert_eq!(parse_milli("1.5"), Some(1500));
        assert_eq!(parse_milli("2k"), Some(2_000_000));
        assert_eq!(parse_milli("1Ki"), Some(1_024_000));
        assert_eq!(parse_milli("16Gi"), Some(16 * (1 << 30) * 1000));
        assert_eq!(parse_milli("1e3"), Some(1_000_000));
        assert_eq!(parse_milli("1E-3"), Some(1));
        assert_eq!(parse_milli("1n"), Some(1), "rounds up");
        assert_eq!(parse_milli("-1"), Some(-1000));
        assert_eq!(parse_milli("abc"), None);
        assert_eq!(parse_milli("1.2.3"), None);
        assert_eq!(parse_milli("5Zi"), None);
        assert_eq!(whole(&Quantity("1500m".into())), Some(1));
    }

    #[test]
    fn pod_requests_count_init_containers_as_the_scheduler_does() {
        let pod: PodFacts = serde_json::from_value(serde_json::json!({"spec": {
        "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "2"}}}],
        "containers": [
            {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "500m"}}},
            {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "2"}, "requests": {"cpu": "500m"}}}
        ]}}))
        .unwrap();
        let requests = pod_requests(&pod);
        assert_eq!(
            requests["cpu"], 2000,
            "the init container's 2 CPUs exceed the containers' 1"
        );
        assert_eq!(
            pod_gpu_requests(&pod)["nvidia.com/gpu"],
            3,
            "a GPU limit is a GPU request"
        );
        assert_eq!(format_milli("cpu", 2500), "2500m");
        assert_eq!(format_milli("memory", 16 * (1 << 30) * 1000), "16Gi");
    }
}
