//! The Kubernetes manifests under `deploy/kubernetes/` and the containers' health checks. Every
//! kustomize overlay is checked as `kubectl kustomize` renders it, i.e. as `kubectl apply -k`
//! applies it: the renderings pass a strict schema check (`tests/tools/validate-kubernetes.sh`,
//! which renders them), the fencegate configuration in every ConfigMap passes `check-config`,
//! every gateway container (in a Deployment or a StatefulSet) serves its ConfigMap with liveness
//! on `/healthz` and readiness on `/readyz` of that configuration's admin port (the sidecar as a
//! native sidecar), its volumes fit its store and its replicas, and the Dockerfile's and the
//! compose file's health checks run a command that passes against a running gateway and fails
//! once it is gone.
//!
//! The tree has no YAML crate: PyYAML, which the validation script installs with
//! kubernetes-validate, reads the YAML and hands it over as JSON.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use fencegate::config::{Config, StoreConfig};
use serde_json::Value;

use crate::support::gateway::fenced_route;
use crate::support::process::{binary, Launch};

/// The kustomize overlays, one directory each, from the repository root.
const MANIFESTS: &str = "deploy/kubernetes/overlays";
/// Renders every overlay and checks the renderings against the schemas, strictly; installs
/// kubernetes-validate (and PyYAML) if missing. `--out DIR` keeps the renderings.
const VALIDATOR: &str = "tests/tools/validate-kubernetes.sh";
/// fencegate's container name in every pod of the manifests.
const CONTAINER: &str = "fencegate";
/// The value given to every environment variable a configuration names for `check-config`:
/// longer than the admin token's 16-character minimum.
const DUMMY_SECRET: &str = "dummy-secret-for-check-config";
/// The admin token of the gateway the health checks are run against.
const ADMIN_TOKEN: &str = "deploy-test-admin-token-0123456789";
/// How long a freshly started gateway may take until `fencegate health` passes.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

fn repo_path(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// Where the schema check leaves each overlay's rendering, as `NAME.yaml`.
fn rendered_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("deploy-kubernetes-rendered")
}

/// The schema check's run, once per test binary. The tests that read YAML wait for it too: it
/// renders the overlays they read, and installs PyYAML where it is missing.
fn validation() -> &'static Output {
    static RUN: OnceLock<Output> = OnceLock::new();
    RUN.get_or_init(|| {
        let out = rendered_dir();
        // No rendering left from an earlier run may stand in for one that failed now.
        match std::fs::remove_dir_all(&out) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("remove {}: {e}", out.display()),
        }
        Command::new("bash")
            .arg(repo_path(VALIDATOR))
            .arg("--out")
            .arg(&out)
            .output()
            .expect("run tests/tools/validate-kubernetes.sh")
    })
}

/// Every YAML document of `file` as JSON (empty documents left out, merge keys resolved).
fn yaml_documents(file: &Path) -> Vec<Value> {
    const TO_JSON: &str = r#"
import json, sys, yaml
with open(sys.argv[1]) as f:
    documents = [d for d in yaml.safe_load_all(f) if d is not None]
print(json.dumps(documents))
"#;
    validation();
    let output = Command::new("python3")
        .args(["-c", TO_JSON])
        .arg(file)
        .output()
        .expect("run python3");
    assert!(
        output.status.success(),
        "{}: not read as YAML (PyYAML comes with {VALIDATOR}): {}",
        file.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("PyYAML's JSON")
}

/// One overlay's rendering and its resources.
struct ManifestFile {
    name: String,
    resources: Vec<Value>,
}

impl ManifestFile {
    fn of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.resources.iter().filter(move |r| r["kind"] == kind)
    }

    fn named(&self, kind: &str, name: &str) -> Option<&Value> {
        self.resources
            .iter()
            .find(|r| r["kind"] == kind && r["metadata"]["name"] == name)
    }
}

/// Every overlay under [`MANIFESTS`] (a directory with a `kustomization.yaml`) as `kubectl
/// kustomize` rendered it for the schema check, in name order.
fn manifest_files() -> Vec<ManifestFile> {
    let mut overlays: Vec<String> = std::fs::read_dir(repo_path(MANIFESTS))
        .expect("read deploy/kubernetes/overlays")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.join("kustomization.yaml").is_file())
        .map(|path| {
            let name = path.file_name().expect("a directory name");
            name.to_string_lossy().into_owned()
        })
        .collect();
    overlays.sort();
    assert!(!overlays.is_empty(), "no overlays under {MANIFESTS}");
    let output = validation();
    overlays
        .into_iter()
        .map(|overlay| {
            let rendering = rendered_dir().join(format!("{overlay}.yaml"));
            assert!(
                rendering.is_file(),
                "{MANIFESTS}/{overlay}: not rendered by {VALIDATOR}:\n{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            ManifestFile {
                name: format!("{MANIFESTS}/{overlay}"),
                resources: yaml_documents(&rendering),
            }
        })
        .collect()
}

/// fencegate in one Deployment or StatefulSet: its container, the pod around it, and the
/// configuration it serves.
struct Gateway<'a> {
    /// `overlay: kind/name`, for messages.
    at: String,
    /// The Deployment or StatefulSet.
    workload: &'a Value,
    pod: &'a Value,
    container: &'a Value,
    /// An `initContainers` entry rather than one of `containers`.
    in_init_containers: bool,
    /// The configuration's text, from its ConfigMap.
    config_text: String,
    config: Config,
}

/// The gateway of every Deployment and StatefulSet of `file` that has a container named
/// [`CONTAINER`].
fn gateways(file: &ManifestFile) -> Vec<Gateway<'_>> {
    let mut found = Vec::new();
    let workloads = file
        .of_kind("Deployment")
        .chain(file.of_kind("StatefulSet"));
    for workload in workloads {
        let at = format!(
            "{}: {}/{}",
            file.name,
            workload["kind"].as_str().unwrap_or("?").to_lowercase(),
            workload["metadata"]["name"].as_str().unwrap_or("?")
        );
        let pod = &workload["spec"]["template"]["spec"];
        let named = |field: &str| {
            pod[field]
                .as_array()
                .and_then(|containers| containers.iter().find(|c| c["name"] == CONTAINER))
        };
        let (container, in_init_containers) = match (named("initContainers"), named("containers")) {
            (Some(_), Some(_)) => panic!("{at}: two containers named {CONTAINER}"),
            (Some(c), None) => (c, true),
            (None, Some(c)) => (c, false),
            (None, None) => continue,
        };
        let config_text = served_config(file, pod, container, &at);
        let config = read_config(&config_text, &at);
        found.push(Gateway {
            at,
            workload,
            pod,
            container,
            in_init_containers,
            config_text,
            config,
        });
    }
    found
}

/// The settings of a configuration as fencegate reads them, without the checks that need its
/// environment (`check-config` makes those, in a process of its own).
fn read_config(text: &str, at: &str) -> Config {
    toml::from_str(text).unwrap_or_else(|e| panic!("{at}: not a fencegate configuration: {e}"))
}

/// The text of the configuration `container` serves: its arguments must be `serve --config
/// DIR/KEY`, with a ConfigMap volume of the same file mounted at `DIR` holding `KEY`.
fn served_config(file: &ManifestFile, pod: &Value, container: &Value, at: &str) -> String {
    let args = strings(&container["args"]);
    let path = match args.as_slice() {
        [serve, flag, path] if serve == "serve" && flag == "--config" => path,
        _ => panic!("{at}: {CONTAINER}'s args must be [serve, --config, FILE], not {args:?}"),
    };
    let (dir, key) = path
        .rsplit_once('/')
        .unwrap_or_else(|| panic!("{at}: --config {path} is not an absolute path"));
    let mount = list(&container["volumeMounts"])
        .find(|m| m["mountPath"] == dir)
        .unwrap_or_else(|| panic!("{at}: no volume is mounted at {dir}, where --config {path} is"));
    let volume = volume_named(pod, &mount["name"]);
    let map = volume["configMap"]["name"]
        .as_str()
        .unwrap_or_else(|| panic!("{at}: the volume at {dir} is not a ConfigMap"));
    assert!(
        volume["configMap"].get("items").is_none(),
        "{at}: the ConfigMap volume at {dir} lists items; its keys are expected as file names"
    );
    let map = file
        .named("ConfigMap", map)
        .unwrap_or_else(|| panic!("{at}: ConfigMap {map}, mounted at {dir}, is not in the file"));
    map["data"][key]
        .as_str()
        .unwrap_or_else(|| panic!("{at}: the ConfigMap mounted at {dir} has no key {key}"))
        .to_owned()
}

fn list(value: &Value) -> impl Iterator<Item = &Value> {
    value.as_array().into_iter().flatten()
}

fn strings(value: &Value) -> Vec<String> {
    list(value)
        .map(|v| {
            v.as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| v.to_string())
        })
        .collect()
}

fn volume_named<'a>(pod: &'a Value, name: &Value) -> &'a Value {
    list(&pod["volumes"])
        .find(|v| &v["name"] == name)
        .unwrap_or_else(|| panic!("the pod has no volume {name}"))
}

/// A volume a gateway's container mounts.
enum Volume<'a> {
    /// One of the pod's `volumes`: the same for every replica of a Deployment or StatefulSet.
    Pod(&'a Value),
    /// A StatefulSet's `volumeClaimTemplates` entry: a PersistentVolumeClaim of each replica's
    /// own, kept across the pod's restarts and replacements (it takes the place of a pod volume
    /// of the same name).
    ClaimTemplate,
}

impl Volume<'_> {
    /// Kept when the pod is deleted (a rollout, an eviction, a drained node).
    fn outlives_the_pod(&self) -> bool {
        match self {
            Volume::Pod(volume) => volume.get("persistentVolumeClaim").is_some(),
            Volume::ClaimTemplate => true,
        }
    }

    /// One volume for every replica: a claim named in the pod template.
    fn shared_by_the_replicas(&self) -> bool {
        match self {
            Volume::Pod(volume) => volume.get("persistentVolumeClaim").is_some(),
            Volume::ClaimTemplate => false,
        }
    }
}

/// The volume a gateway's container mounts as `name`.
fn gateway_volume<'a>(gateway: &Gateway<'a>, name: &Value) -> Volume<'a> {
    let mut templates = list(&gateway.workload["spec"]["volumeClaimTemplates"]);
    if gateway.workload["kind"] == "StatefulSet"
        && templates.any(|t| &t["metadata"]["name"] == name)
    {
        return Volume::ClaimTemplate;
    }
    Volume::Pod(volume_named(gateway.pod, name))
}

/// The container port `port` means: a number, or the name of one of the container's ports.
fn container_port(container: &Value, port: &Value) -> Option<u64> {
    match port {
        Value::Number(number) => number.as_u64(),
        Value::String(name) => list(&container["ports"]).find(|p| p["name"] == name.as_str())?
            ["containerPort"]
            .as_u64(),
        _ => None,
    }
}

/// The volume (and whether it is mounted read-only) holding `path` in the gateway's container:
/// the mount at the longest directory above it.
fn volume_holding<'a>(gateway: &Gateway<'a>, path: &Path) -> Option<(Volume<'a>, bool)> {
    let mount = list(&gateway.container["volumeMounts"])
        .filter(|m| {
            m["mountPath"]
                .as_str()
                .is_some_and(|dir| path.starts_with(dir))
        })
        .max_by_key(|m| m["mountPath"].as_str().map_or(0, str::len))?;
    let read_only = mount["readOnly"] == true;
    Some((gateway_volume(gateway, &mount["name"]), read_only))
}

/// The environment variables a configuration reads: every `*_env` value and every `${NAME}`.
fn env_names(config_text: &str) -> Vec<String> {
    fn collect(value: &toml::Value, key: &str, names: &mut Vec<String>) {
        match value {
            toml::Value::String(text) => {
                if key.ends_with("_env") {
                    names.push(text.clone());
                }
                let mut rest = text.as_str();
                while let Some((_, after)) = rest.split_once("${") {
                    let Some((name, tail)) = after.split_once('}') else {
                        break;
                    };
                    names.push(name.to_owned());
                    rest = tail;
                }
            }
            toml::Value::Array(items) => items.iter().for_each(|v| collect(v, key, names)),
            toml::Value::Table(table) => table.iter().for_each(|(k, v)| collect(v, k, names)),
            _ => {}
        }
    }
    let table: toml::Table = config_text.parse().expect("the configuration is TOML");
    let mut names = Vec::new();
    collect(&toml::Value::Table(table), "", &mut names);
    names.sort();
    names.dedup();
    names
}

/// `probe` of the gateway's container GETs `path` on the configuration's admin port.
fn assert_probe_asks_admin(gateway: &Gateway, probe: &str, path: &str) {
    let at = &gateway.at;
    let admin = gateway
        .config
        .admin
        .as_ref()
        .unwrap_or_else(|| panic!("{at}: the configuration has no [admin] listener to probe"))
        .listen;
    let get = &gateway.container[probe]["httpGet"];
    assert_eq!(
        get["path"], path,
        "{at}: {CONTAINER}'s {probe} must GET {path}: {get}"
    );
    assert_eq!(
        container_port(gateway.container, &get["port"]),
        Some(u64::from(admin.port())),
        "{at}: {CONTAINER}'s {probe} must ask the admin listener's port ({admin}): {get}"
    );
}

/// The value after `flag` in `args`.
fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let at = args.iter().position(|a| a == flag)?;
    args.get(at + 1).map(String::as_str)
}

#[test]
fn manifests_pass_the_strict_kubernetes_schema_check() {
    let output = validation();
    assert!(
        output.status.success(),
        "{VALIDATOR} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn every_configmap_configuration_passes_check_config() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut checked = Vec::new();
    for file in manifest_files() {
        for map in file.of_kind("ConfigMap") {
            let name = map["metadata"]["name"].as_str().unwrap_or("?");
            let tomls = map["data"].as_object().into_iter().flatten();
            for (key, text) in tomls.filter(|(key, _)| key.ends_with(".toml")) {
                let at = format!("{}: configmap/{name} {key}", file.name);
                let text = text
                    .as_str()
                    .unwrap_or_else(|| panic!("{at}: not a string"));
                let path = dir.path().join(format!("{name}-{key}"));
                std::fs::write(&path, text).expect("write the configuration");
                let mut command = Command::new(binary());
                command.arg("check-config").arg(&path);
                for name in env_names(text) {
                    command.env(name, DUMMY_SECRET);
                }
                let output = command.output().expect("run fencegate check-config");
                assert!(
                    output.status.success(),
                    "{at}: fencegate check-config failed: {}",
                    String::from_utf8_lossy(&output.stderr)
                );
                checked.push(at);
            }
        }
    }
    assert!(
        !checked.is_empty(),
        "no fencegate configuration (a *.toml key) in the ConfigMaps under {MANIFESTS}"
    );
    println!("check-config passed: {checked:?}");
}

#[test]
fn sidecar_is_a_native_sidecar_in_front_of_the_application() {
    let files = manifest_files();
    let file = files
        .iter()
        .find(|f| f.name.ends_with("/sidecar"))
        .expect("deploy/kubernetes/overlays/sidecar");
    let gateways = gateways(file);
    let [gateway] = gateways.as_slice() else {
        panic!(
            "{}: expected one workload with a {CONTAINER} container, found {}",
            file.name,
            gateways.len()
        );
    };
    let at = &gateway.at;
    assert!(
        gateway.in_init_containers,
        "{at}: {CONTAINER} must be an initContainers entry (a native sidecar), not in containers"
    );
    assert_eq!(
        gateway.container["restartPolicy"], "Always",
        "{at}: a native sidecar is an initContainers entry with restartPolicy: Always"
    );
    assert!(
        list(&gateway.pod["containers"]).count() >= 1,
        "{at}: no application container beside the sidecar"
    );
    assert_probe_asks_admin(gateway, "livenessProbe", "/healthz");
    assert_probe_asks_admin(gateway, "readinessProbe", "/readyz");
    // In front of the application in the same pod: every route forwards to the pod's loopback.
    for route in &gateway.config.routes {
        let upstream = url::Url::parse(&route.upstream).expect("a valid upstream URL");
        let host = upstream.host_str().unwrap_or("");
        assert!(
            host == "localhost"
                || host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback()),
            "{at}: route {} forwards to {}, not to the application on the pod's loopback",
            route.name,
            route.upstream
        );
    }
}

#[test]
fn every_gateway_serves_its_configmap_with_probes_on_its_admin_port() {
    let dockerfile_uid = dockerfile_user_id();
    let files = manifest_files();
    let mut seen = 0;
    for file in &files {
        for gateway in gateways(file) {
            seen += 1;
            let at = &gateway.at;
            assert_probe_asks_admin(&gateway, "livenessProbe", "/healthz");
            assert_probe_asks_admin(&gateway, "readinessProbe", "/readyz");
            if gateway.container.get("startupProbe").is_some() {
                assert_probe_asks_admin(&gateway, "startupProbe", "/healthz");
            }

            // Every secret the configuration reads from the environment is set on the container.
            let env: Vec<String> = list(&gateway.container["env"])
                .filter_map(|e| e["name"].as_str().map(str::to_owned))
                .collect();
            for name in env_names(&gateway.config_text) {
                assert!(
                    env.contains(&name),
                    "{at}: the configuration reads {name}, which {CONTAINER}'s env does not set"
                );
            }

            // SIGKILL comes after the pod's grace period: it must leave the preStop pause, the
            // drain delay and shutdown_grace to drain.
            let grace = gateway.pod["terminationGracePeriodSeconds"]
                .as_u64()
                .unwrap_or(30);
            let pre_stop = &gateway.container["lifecycle"]["preStop"];
            let paused = if pre_stop.is_null() {
                Duration::ZERO
            } else {
                let command: Vec<&str> = list(&pre_stop["exec"]["command"])
                    .filter_map(|part| part.as_str())
                    .collect();
                match command[..] {
                    ["/bin/sleep", seconds] => {
                        Duration::from_secs(seconds.parse().expect("preStop sleeps whole seconds"))
                    }
                    _ => panic!("{at}: a preStop hook other than a pause: {pre_stop}"),
                }
            };
            let server = &gateway.config.server;
            let needed = paused + server.drain_delay + server.shutdown_grace;
            assert!(
                Duration::from_secs(grace) > needed,
                "{at}: terminationGracePeriodSeconds {grace} must exceed the preStop pause \
                 {paused:?}, drain_delay {:?} and shutdown_grace {:?} together",
                server.drain_delay,
                server.shutdown_grace
            );

            // The image's user, on a read-only root filesystem.
            let security = |field: &str| {
                let own = &gateway.container["securityContext"][field];
                if own.is_null() {
                    gateway.pod["securityContext"][field].clone()
                } else {
                    own.clone()
                }
            };
            assert_eq!(
                security("runAsUser").as_u64(),
                Some(dockerfile_uid),
                "{at}: {CONTAINER} must run as the Dockerfile's user {dockerfile_uid}"
            );
            assert_eq!(security("runAsNonRoot"), true, "{at}: runAsNonRoot");
            assert_eq!(
                gateway.container["securityContext"]["readOnlyRootFilesystem"], true,
                "{at}: {CONTAINER}'s root filesystem must be read-only"
            );
            // So everything it writes is on a writable volume.
            let mut written = vec![gateway.config.server.state_dir.clone()];
            if let StoreConfig::Embedded(embedded) = &gateway.config.store {
                written.push(embedded.path.clone());
            }
            for path in written {
                let holder = volume_holding(&gateway, &path);
                assert!(
                    matches!(holder, Some((_, false))),
                    "{at}: {} is on no writable volume (the root filesystem is read-only)",
                    path.display()
                );
            }

            // Every Service that selects the pods sends clients to the data plane.
            let labels = &gateway.workload["spec"]["template"]["metadata"]["labels"];
            let listen = gateway.config.server.listen;
            for service in file.of_kind("Service") {
                let selector = service["spec"]["selector"].as_object();
                let selects = selector.is_some_and(|s| s.iter().all(|(k, v)| &labels[k] == v));
                if !selects {
                    continue;
                }
                for port in list(&service["spec"]["ports"]) {
                    let target = port.get("targetPort").unwrap_or(&port["port"]);
                    assert_eq!(
                        container_port(gateway.container, target),
                        Some(u64::from(listen.port())),
                        "{at}: service/{} sends clients to {target}, not to the gateway's {listen}",
                        service["metadata"]["name"]
                    );
                }
            }
        }
    }
    assert!(
        seen >= 3,
        "expected the sidecar, the embedded and the shared gateway under {MANIFESTS}, found {seen} \
         gateways"
    );
}

#[test]
fn store_and_state_dir_volumes_fit_the_backend_and_the_replicas() {
    let files = manifest_files();
    let mut shared = 0;
    let mut stateful = 0;
    for file in &files {
        for gateway in gateways(file) {
            let at = &gateway.at;
            let spec = &gateway.workload["spec"];
            let is_stateful_set = gateway.workload["kind"] == "StatefulSet";
            stateful += usize::from(is_stateful_set);
            let replicas = spec["replicas"].as_u64().unwrap_or(1);
            let volume = |path: &Path| {
                volume_holding(&gateway, path)
                    .unwrap_or_else(|| panic!("{at}: no volume holds {}", path.display()))
                    .0
            };
            let state_dir = &gateway.config.server.state_dir;
            match &gateway.config.store {
                StoreConfig::Embedded(embedded) => {
                    // One file, one pod: the marks of several pods would not be shared.
                    assert_eq!(replicas, 1, "{at}: the embedded store serves one replica");
                    // A StatefulSet deletes a replica's pod before it creates the next one; a
                    // Deployment does only with strategy Recreate.
                    assert!(
                        is_stateful_set || spec["strategy"]["type"] == "Recreate",
                        "{at}: the old pod must let go of the store before the new one opens it"
                    );
                    // The marks and the adoption record must outlive the pod.
                    for path in [&embedded.path, state_dir] {
                        assert!(
                            volume(path).outlives_the_pod(),
                            "{at}: {} must be on a PersistentVolumeClaim: an emptyDir goes with \
                             the pod, and with it every mark",
                            path.display()
                        );
                    }
                }
                _ => {
                    shared += usize::from(replicas >= 2);
                    // One state_dir per replica: a claim in the pod template is one volume for all.
                    assert!(
                        replicas < 2 || !volume(state_dir).shared_by_the_replicas(),
                        "{at}: {replicas} replicas would share the claim at state_dir {}",
                        state_dir.display()
                    );
                }
            }
            if is_stateful_set {
                // What a StatefulSet is for: each replica keeps its own state_dir (the adoption
                // record) across rollouts and evictions, on a claim of its own.
                assert!(
                    matches!(volume(state_dir), Volume::ClaimTemplate),
                    "{at}: state_dir {} must be on one of the volumeClaimTemplates",
                    state_dir.display()
                );
                // Its governing Service is headless and in the same overlay.
                let name = spec["serviceName"].as_str().unwrap_or_default();
                let service = file
                    .named("Service", name)
                    .unwrap_or_else(|| panic!("{at}: serviceName {name:?} is not in the overlay"));
                assert_eq!(
                    service["spec"]["clusterIP"], "None",
                    "{at}: service/{name}, its serviceName, must be headless"
                );
            }
        }
    }
    assert!(
        shared >= 1,
        "no gateway under {MANIFESTS} runs several replicas on a shared store"
    );
    assert!(
        stateful >= 1,
        "no gateway under {MANIFESTS} is a StatefulSet (state_dir on a volume of each replica's own)"
    );
}

/// Every file the crate reads while it compiles (`include_str!`, `include_bytes!`,
/// `sqlx::migrate!`) is copied into the Dockerfile's build stage: a build from a clean context
/// otherwise fails, as the image build found with `docs/admin-openapi.json`.
#[test]
fn the_build_stage_copies_every_file_the_crate_reads_while_it_compiles() {
    let root = repo_path("");
    let mut inputs = Vec::new();
    let mut dirs = vec![repo_path("src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src") {
            let path = entry.expect("a src entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|ext| ext != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read a source file");
            for (mac, relative_to_file) in [
                ("include_str!(\"", true),
                ("include_bytes!(\"", true),
                ("sqlx::migrate!(\"", false),
            ] {
                for (at, _) in text.match_indices(mac) {
                    let rest = &text[at + mac.len()..];
                    let Some(end) = rest.find('"') else { continue };
                    let base = match relative_to_file {
                        true => path.parent().expect("a file's folder").to_path_buf(),
                        false => root.clone(),
                    };
                    let file = std::fs::canonicalize(base.join(&rest[..end]))
                        .unwrap_or_else(|e| panic!("{}: {}: {e}", path.display(), &rest[..end]));
                    let root = std::fs::canonicalize(&root).expect("the repository");
                    let relative = file.strip_prefix(&root).expect("inside the repository");
                    inputs.push(relative.to_path_buf());
                }
            }
        }
    }
    assert!(
        inputs.iter().any(|p| p.starts_with("migrations")),
        "the scan found no migrations: {inputs:?}"
    );
    // The build stage: from the first FROM to the next.
    let instructions = dockerfile();
    let stage: Vec<_> = instructions
        .iter()
        .skip_while(|(name, _)| name != "FROM")
        .skip(1)
        .take_while(|(name, _)| name != "FROM")
        .collect();
    let copied: Vec<PathBuf> = stage
        .iter()
        .filter(|(name, args)| name == "COPY" && !args.starts_with("--from"))
        .flat_map(|(_, args)| {
            let words: Vec<&str> = args.split_whitespace().collect();
            let sources = &words[..words.len().saturating_sub(1)];
            sources
                .iter()
                .map(|source| PathBuf::from(source.trim_start_matches("./")))
                .collect::<Vec<_>>()
        })
        .collect();
    for input in &inputs {
        assert!(
            copied.iter().any(|source| input.starts_with(source)),
            "the Dockerfile's build stage does not copy {}, which the crate reads while it \
             compiles (copied: {copied:?})",
            input.display()
        );
    }
}

/// The Dockerfile's instructions, continuation lines joined and comments left out, as
/// (instruction, arguments).
fn dockerfile() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo_path("Dockerfile")).expect("read the Dockerfile");
    let mut instructions = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || (line.is_empty() && current.is_empty()) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => current.push_str(part),
            None => {
                current.push_str(line);
                let (instruction, args) = current.trim().split_once(' ').unwrap_or((&current, ""));
                instructions.push((instruction.to_uppercase(), args.trim().to_owned()));
                current.clear();
            }
        }
    }
    instructions
}

/// The arguments of the Dockerfile's last `instruction`.
fn dockerfile_last(instructions: &[(String, String)], instruction: &str) -> String {
    instructions
        .iter()
        .rev()
        .find(|(name, _)| name == instruction)
        .map(|(_, args)| args.clone())
        .unwrap_or_else(|| panic!("the Dockerfile has no {instruction}"))
}

fn exec_form(args: &str, what: &str) -> Vec<String> {
    serde_json::from_str(args).unwrap_or_else(|e| {
        panic!("the Dockerfile's {what} is not an exec-form list ({e}): {args}")
    })
}

/// The runtime image's user id (`USER uid[:gid]`).
fn dockerfile_user_id() -> u64 {
    let user = dockerfile_last(&dockerfile(), "USER");
    let uid = user.split(':').next().unwrap_or("");
    uid.parse()
        .unwrap_or_else(|_| panic!("the Dockerfile's USER {user} is not a numeric uid"))
}

/// The Dockerfile's HEALTHCHECK command, checked against the image: the image's fencegate,
/// `health`, and the configuration the default command serves.
fn dockerfile_health_check() -> Vec<String> {
    let instructions = dockerfile();
    let health = dockerfile_last(&instructions, "HEALTHCHECK");
    let (_, command) = health
        .split_once("CMD ")
        .unwrap_or_else(|| panic!("HEALTHCHECK {health}: no CMD"));
    let argv = exec_form(command.trim(), "HEALTHCHECK CMD");
    let entrypoint = exec_form(&dockerfile_last(&instructions, "ENTRYPOINT"), "ENTRYPOINT");
    let serve = exec_form(&dockerfile_last(&instructions, "CMD"), "CMD");
    assert_eq!(
        argv.first(),
        entrypoint.first(),
        "the HEALTHCHECK must run the image's fencegate"
    );
    assert_eq!(argv.get(1).map(String::as_str), Some("health"), "{argv:?}");
    assert_eq!(
        flag_value(&argv, "--config"),
        flag_value(&serve, "--config"),
        "the HEALTHCHECK must read the configuration the gateway serves"
    );
    argv
}

/// `args` with the value of `--config` replaced by `config`.
fn with_config(args: &[String], config: &Path) -> Vec<String> {
    let mut args = args.to_vec();
    let at = args
        .iter()
        .position(|a| a == "--config")
        .expect("a --config flag");
    args[at + 1] = config.display().to_string();
    args
}

/// Runs `fencegate health_args…` (its `--config` pointed at the gateway's own file) against a
/// running gateway, where it must pass, and after the gateway is gone, where it must exit 1.
fn assert_health_check_asks_the_gateway(health_args: &[String]) {
    let dir = tempfile::tempdir().expect("temp dir");
    let routes = fenced_route("invoices", "http://127.0.0.1:9", "enforce", "monotonic");
    let gateway = Launch::new()
        .admin(ADMIN_TOKEN, "")
        .start(dir.path(), &routes);
    let args = with_config(health_args, &dir.path().join("fencegate.toml"));
    let run = || {
        Command::new(binary())
            .args(&args)
            .output()
            .expect("run fencegate health")
    };
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let output = run();
        if output.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "`fencegate {}` did not pass against a running gateway within {READY_TIMEOUT:?} \
             ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    gateway.kill_9();
    let output = run();
    assert_eq!(
        output.status.code(),
        Some(1),
        "`fencegate {}` must fail (exit 1) once the gateway is gone: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn dockerfile_health_check_asks_the_gateway_the_image_serves() {
    let argv = dockerfile_health_check();
    let config = flag_value(&argv, "--config").expect("HEALTHCHECK --config FILE");
    // The file the image ships there must name an admin listener for `health` to ask.
    let source = dockerfile()
        .into_iter()
        .filter(|(instruction, _)| instruction == "COPY")
        .find_map(|(_, args)| {
            let parts: Vec<&str> = args.split_whitespace().collect();
            let is_destination = parts.last() == Some(&config) && !parts[0].starts_with("--");
            is_destination.then(|| parts[0].to_owned())
        })
        .unwrap_or_else(|| panic!("no COPY in the Dockerfile puts a file at {config}"));
    let text = std::fs::read_to_string(repo_path(&source)).expect("read the shipped configuration");
    let shipped = read_config(&text, &source);
    assert!(
        shipped.admin.is_some(),
        "{source}, which the image serves at {config}, has no [admin] listener: the HEALTHCHECK's \
         `fencegate health` has nothing to ask, and the container would never be healthy"
    );
    assert_health_check_asks_the_gateway(&argv[1..]);
}

#[test]
fn compose_health_checks_ask_each_gateway_replica() {
    let dockerfile_argv = dockerfile_health_check();
    let compose_file = repo_path("deploy/docker-compose.yml");
    let compose = yaml_documents(&compose_file).swap_remove(0);
    let services = compose["services"].as_object().expect("services");
    let gateways: Vec<_> = services
        .iter()
        .filter(|(_, s)| {
            s.get("build").is_some()
                || s["image"]
                    .as_str()
                    .is_some_and(|i| i.starts_with("fencegate"))
        })
        .collect();
    assert!(
        gateways.len() >= 2,
        "deploy/docker-compose.yml: expected the two gateway replicas, found {:?}",
        gateways.iter().map(|(name, _)| name).collect::<Vec<_>>()
    );
    for (name, service) in gateways {
        let test = strings(&service["healthcheck"]["test"]);
        let Some(("CMD", argv)) = test.split_first().map(|(f, rest)| (f.as_str(), rest)) else {
            panic!(
                "{name}: healthcheck.test must be the exec form [\"CMD\", fencegate, \"health\", …], \
                 not {}",
                service["healthcheck"]["test"]
            );
        };
        let config = flag_value(argv, "--config")
            .unwrap_or_else(|| panic!("{name}: the health check names no --config: {argv:?}"));
        assert_eq!(
            argv,
            with_config(&dockerfile_argv, Path::new(config)),
            "{name}: the health check must be the Dockerfile's HEALTHCHECK command"
        );
        // The file mounted at that path must name an admin listener for `health` to ask.
        let source = strings(&service["volumes"])
            .into_iter()
            .find_map(|volume| {
                let mut parts = volume.split(':');
                let (source, target) = (parts.next()?, parts.next()?);
                (target == config).then(|| source.to_owned())
            })
            .unwrap_or_else(|| panic!("{name}: no volume is mounted at {config}"));
        let mounted = compose_file.parent().expect("deploy/").join(&source);
        let text = std::fs::read_to_string(&mounted).expect("read the mounted configuration");
        let config_file = read_config(&text, &format!("{name}: {source}"));
        assert!(
            config_file.admin.is_some(),
            "{name}: {source}, mounted at {config}, has no [admin] listener to ask"
        );
    }
    assert_health_check_asks_the_gateway(&dockerfile_argv[1..]);
}
