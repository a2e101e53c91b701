//! Whole-crate tests: the shipped samples, and that no field of a manifest is lost on the way through the
//! Rust types.

mod samples {
    use gpuop_api::manifest::check_manifests;
    use gpuop_api::{ClusterPolicy, ImageDefaults, NVIDIADriver};
    use serde_json::Value;

    const SAMPLES: &[(&str, &str)] = &[
        (
            "clusterpolicy.yaml",
            include_str!("../../../deploy/samples/clusterpolicy.yaml"),
        ),
        (
            "clusterpolicy-mig-mixed-time-slicing.yaml",
            include_str!("../../../deploy/samples/clusterpolicy-mig-mixed-time-slicing.yaml"),
        ),
        (
            "clusterpolicy-preinstalled-driver.yaml",
            include_str!("../../../deploy/samples/clusterpolicy-preinstalled-driver.yaml"),
        ),
        (
            "nvidiadrivers.yaml",
            include_str!("../../../deploy/samples/nvidiadrivers.yaml"),
        ),
    ];

    fn documents(text: &str) -> Vec<Value> {
        serde_saphyr::from_multiple(text).unwrap()
    }

    #[test]
    fn every_sample_passes_the_check_without_warnings() {
        for (name, text) in SAMPLES {
            let reports = check_manifests(text, &ImageDefaults::default());
            let checked: Vec<_> = reports.iter().filter(|r| r.skipped.is_none()).collect();
            assert!(
                !checked.is_empty(),
                "{name} holds no ClusterPolicy or NVIDIADriver"
            );
            for report in checked {
                assert!(report.is_valid(), "{name}: {:#?}", report.errors);
                assert!(report.warnings.is_empty(), "{name}: {:#?}", report.warnings);
            }
        }
    }

    /// `original` parsed as `K`, serialized, parsed again (checked equal to the first parse) and serialized.
    fn reparsed<K>(original: &Value, name: &str) -> Value
    where
        K: serde::de::DeserializeOwned + serde::Serialize + PartialEq + std::fmt::Debug,
    {
        let typed: K = serde_json::from_value(original.clone()).unwrap();
        let again: K = serde_json::from_value(serde_json::to_value(&typed).unwrap()).unwrap();
        assert_eq!(typed, again, "{name}");
        serde_json::to_value(&again).unwrap()
    }

    #[test]
    fn samples_survive_parse_serialize_parse_unchanged() {
        for (name, text) in SAMPLES {
            for original in documents(text) {
                let round_tripped = match original["kind"].as_str() {
                    Some("ClusterPolicy") => reparsed::<ClusterPolicy>(&original, name),
                    Some("NVIDIADriver") => reparsed::<NVIDIADriver>(&original, name),
                    _ => continue,
                };
                assert_eq!(round_tripped, original, "{name}: a field was lost or changed");
            }
        }
    }

    #[test]
    fn the_default_sample_is_the_one_the_mig_and_driver_samples_vary() {
        let policy: ClusterPolicy = serde_saphyr::from_str(SAMPLES[0].1).unwrap();
        assert_eq!(policy.metadata.name.as_deref(), Some("cluster-policy"));
        let mig: Vec<Value> = documents(SAMPLES[1].1);
        let mig: ClusterPolicy = serde_json::from_value(mig[1].clone()).unwrap();
        assert_eq!(mig.spec.mig_strategy(), Some("mixed"));
        assert_eq!(
            mig.spec.device_plugin.config.unwrap().name.as_deref(),
            Some("time-slicing-config")
        );
        let preinstalled: ClusterPolicy = serde_saphyr::from_str(SAMPLES[2].1).unwrap();
        assert!(!preinstalled.spec.driver.is_enabled());
        let drivers: Vec<NVIDIADriver> = serde_saphyr::from_multiple(SAMPLES[3].1).unwrap();
        assert_eq!(
            drivers.iter().filter(|d| d.spec.default).count(),
            1,
            "exactly one default NVIDIADriver"
        );
    }
}

mod every_field {
    //! A manifest that sets every field the schema has must come back from the Rust types unchanged.

    use gpuop_api::crd::{cluster_policy_crd, nvidia_driver_crd, openapi_schema};
    use gpuop_api::{ClusterPolicy, NVIDIADriver};
    use serde_json::{Map, Value, json};

    /// A valid value for every field of `schema`.
    fn fill(schema: &Value) -> Value {
        if let Some(Value::Array(values)) = schema.get("enum") {
            return values[0].clone();
        }
        if schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
            return json!("25%");
        }
        match schema.get("type").and_then(Value::as_str) {
            Some("object") => {
                let mut map = Map::new();
                for (key, property) in schema
                    .get("properties")
                    .and_then(Value::as_object)
                    .into_iter()
                    .flatten()
                {
                    map.insert(key.clone(), fill(property));
                }
                if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
                    map.insert("example.com/key".into(), fill(values));
                }
                Value::Object(map)
            }
            Some("array") => json!([fill(&schema["items"])]),
            Some("integer") => json!(1),
            Some("number") => json!(1.5),
            Some("boolean") => json!(true),
            Some("string") if schema.get("format").and_then(Value::as_str) == Some("date-time") => {
                json!("2026-11-30T00:00:00Z")
            }
            Some("string") => json!("x"),
            _ => json!("1"),
        }
    }

    fn object(
        crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    ) -> Value {
        let mut object = fill(&openapi_schema(crd));
        let version = &crd.spec.versions[0].name;
        object["apiVersion"] = json!(format!("{}/{version}", crd.spec.group));
        object["kind"] = json!(crd.spec.names.kind);
        object["metadata"] = json!({"name": "everything"});
        object
    }

    /// The object of [`object`], after checking that it parses as `K` and serializes back unchanged.
    fn round_tripped<K: serde::de::DeserializeOwned + serde::Serialize>(
        crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    ) -> Value {
        let original = object(crd);
        let typed: K = serde_json::from_value(original.clone()).unwrap();
        assert_eq!(serde_json::to_value(&typed).unwrap(), original);
        original
    }

    #[test]
    fn a_cluster_policy_with_every_field_set_round_trips() {
        let original = round_tripped::<ClusterPolicy>(&cluster_policy_crd());
        // Spot checks that the generator reached the deep corners.
        assert_eq!(original["spec"]["operator"]["use_ocp_driver_toolkit"], true);
        assert_eq!(
            original["spec"]["driver"]["upgradePolicy"]["drain"]["enable"],
            true
        );
        assert_eq!(
            original["spec"]["dcgmExporter"]["serviceMonitor"]["relabelings"][0]["action"],
            "replace"
        );
    }

    #[test]
    fn an_nvidia_driver_with_every_field_set_round_trips() {
        let original = round_tripped::<NVIDIADriver>(&nvidia_driver_crd());
        assert_eq!(original["spec"]["gds"]["enabled"], true);
    }
}

/// The keys of NVIDIA's contract are spelled once, in this crate: no other crate's non-test code holds an
/// `nvidia.com` string, so a renamed or mistyped key cannot hide in one corner of the workspace.
mod keys_live_here {
    use std::path::{Path, PathBuf};

    /// Crates whose code may spell the group: this one, and the test-support crate, which names NVIDIA's
    /// own files.
    const EXEMPT: &[&str] = &["api", "testkit"];

    /// The lines of a source file's non-test code that spell `nvidia.com`: the file is cut at its first
    /// `#[cfg(test)]` at column 0 (where every file keeps its tests), and comment lines are passed over.
    fn literals(source: &str) -> Vec<(usize, &str)> {
        source
            .lines()
            .take_while(|line| !line.starts_with("#[cfg(test)]"))
            .enumerate()
            .filter(|(_, line)| !line.trim_start().starts_with("//"))
            .filter(|(_, line)| line.contains("nvidia.com"))
            .map(|(index, line)| (index + 1, line.trim()))
            .collect()
    }

    fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, found);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                found.push(path);
            }
        }
    }

    #[test]
    fn the_scan_sees_a_literal_and_passes_over_comments_and_tests() {
        let source = "// nvidia.com/gpu in a comment\nconst A: &str = \"nvidia.com/gpu\";\n\
                      #[cfg(test)]\nmod tests { const B: &str = \"nvidia.com/x\"; }\n";
        assert_eq!(literals(source), [(2, "const A: &str = \"nvidia.com/gpu\";")]);
    }

    #[test]
    fn no_crate_but_the_api_spells_an_nvidia_key() {
        let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&crates).unwrap() {
            let dir = entry.unwrap().path();
            let name = dir.file_name().unwrap().to_string_lossy().into_owned();
            if dir.join("src").is_dir() && !EXEMPT.contains(&name.as_str()) {
                sources(&dir.join("src"), &mut files);
            }
        }
        assert!(
            files.len() > 100,
            "only {} source files found under {}",
            files.len(),
            crates.display()
        );
        let mut found = Vec::new();
        for file in &files {
            let source = std::fs::read_to_string(file).unwrap();
            for (line, text) in literals(&source) {
                found.push(format!("{}:{line}: {text}", file.display()));
            }
        }
        assert!(
            found.is_empty(),
            "spell these with gpuop_api's constants (labels, catalogue, the resources' own names):\n{}",
            found.join("\n")
        );
    }
}
