//! podman's JSON answers, read into typed structs: only the keys the launcher uses, every other key
//! ignored, and every key that podman omits or writes as `null` in some version or mode read as empty.
//!
//! Checked against podman 4.3.1 (captured here) and 5.8.2 (from its source): the keys below are spelled
//! the same in both. What differs is what is present: rootful podman writes `idMappings` as `null`
//! lists, podman 5 adds a `containers` map to `network inspect`, podman's main branch drops
//! `store.configFile`, and Go's `omitempty` leaves out empty `labels` and `subnets`. The samples live in
//! `launcher/tests/data/podman/<version>/`.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};

/// The largest answer read: far above any real one (a listing of thousands of containers is a few MB),
/// so a runaway answer is refused instead of parsed.
pub const MAX_JSON_BYTES: usize = 64 << 20;

/// podman's JSON could not be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot parse `podman {command}`: {source}")]
pub struct JsonError {
    /// The podman subcommand whose answer it was (`info --format json`, …).
    command: &'static str,
    /// What serde found wrong.
    #[source]
    source: serde_json::Error,
}

fn parse<T: DeserializeOwned>(command: &'static str, json: &str) -> Result<T, JsonError> {
    if json.len() > MAX_JSON_BYTES {
        return Err(JsonError {
            command,
            source: serde::de::Error::custom(format!(
                "the answer is larger than {MAX_JSON_BYTES} bytes"
            )),
        });
    }
    serde_json::from_str(json).map_err(|source| JsonError { command, source })
}

/// A JSON `null` (Go's nil slice or map) read as the type's default.
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// `podman info --format json`.
#[derive(Debug, Default, Deserialize)]
pub struct Info {
    /// The host: mode and id mappings.
    #[serde(default, deserialize_with = "null_as_default")]
    pub host: Host,
    /// Where podman keeps its storage.
    #[serde(default, deserialize_with = "null_as_default")]
    pub store: Store,
    /// podman's own version (`agent-sandbox doctor` checks it).
    #[serde(default, deserialize_with = "null_as_default")]
    pub version: Version,
}

/// `info.version`.
#[derive(Debug, Default, Deserialize)]
pub struct Version {
    /// `4.3.1`, `5.8.2`.
    #[serde(default, rename = "Version")]
    pub version: String,
}

impl Info {
    /// Parses `podman info --format json`.
    pub fn parse(json: &str) -> Result<Info, JsonError> {
        parse("info --format json", json)
    }

    /// Whether more ids than the user's own are mapped, for uids and gids alike (rootless `keep-id`
    /// needs a subordinate range; without one podman maps only the user, and warns).
    #[must_use]
    pub fn subordinate_ids(&self) -> bool {
        let mapped = |m: &[IdMap]| m.iter().map(|e| e.size).sum::<u64>();
        mapped(&self.host.id_mappings.uidmap) > 1 && mapped(&self.host.id_mappings.gidmap) > 1
    }

    /// Where the storage keeps containers' own files: `<driver>-containers` under the graph root and
    /// under the run root (absolute ones only; empty unless both are named, with the driver).
    #[must_use]
    pub fn container_stores(&self) -> Vec<PathBuf> {
        let s = &self.store;
        let dir = format!("{}-containers", s.graph_driver_name);
        let roots = [&s.graph_root, &s.run_root].map(|r| Path::new(r.as_str()).join(&dir));
        if s.graph_driver_name.is_empty() || roots.iter().any(|r| !r.is_absolute()) {
            return Vec::new();
        }
        roots.to_vec()
    }

    /// podman's storage, runtime and configuration paths as it reports them (graphRoot, runRoot,
    /// volumePath, the storage configuration file, its API socket, and every path among the storage
    /// driver's options: additional image stores, whose images sessions run, above all), absolute
    /// ones only.
    #[must_use]
    pub fn paths(&self) -> Vec<PathBuf> {
        let socket = self.host.remote_socket.as_ref().map(|s| s.path.as_str());
        let mut options = Vec::new();
        for value in self.store.graph_options.values() {
            json_strings(value, &mut options);
        }
        [
            Some(self.store.graph_root.as_str()),
            Some(self.store.run_root.as_str()),
            Some(self.store.volume_path.as_str()),
            self.store.config_file.as_deref(),
            socket,
        ]
        .into_iter()
        .flatten()
        .chain(options.iter().flat_map(|o| o.split(',')).map(str::trim))
        .map(|s| PathBuf::from(s.strip_prefix("unix://").unwrap_or(s)))
        .filter(|p| p.is_absolute())
        .collect()
    }
}

/// Every string in a JSON value, however deeply nested (a driver option is a string, a list or an
/// object, by driver and version).
fn json_strings<'a>(value: &'a serde_json::Value, out: &mut Vec<&'a str>) {
    match value {
        serde_json::Value::String(s) => out.push(s),
        serde_json::Value::Array(items) => items.iter().for_each(|v| json_strings(v, out)),
        serde_json::Value::Object(map) => map.values().for_each(|v| json_strings(v, out)),
        _ => {}
    }
}

/// `info.host`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Host {
    /// The user namespace podman runs in (empty lists when rootful).
    #[serde(default, deserialize_with = "null_as_default")]
    pub id_mappings: IdMappings,
    /// Rootless or not.
    #[serde(default, deserialize_with = "null_as_default")]
    pub security: Security,
    /// The API socket (left out by some remote clients).
    #[serde(default)]
    pub remote_socket: Option<RemoteSocket>,
    /// `v1` (also hybrid) or `v2`.
    #[serde(default)]
    pub cgroup_version: String,
    /// `netavark` or `cni`.
    #[serde(default)]
    pub network_backend: String,
    /// The network backend's details: podman 5 names its DNS server (aardvark-dns) here, podman 4.3
    /// leaves it out.
    #[serde(default, deserialize_with = "null_as_default")]
    pub network_backend_info: NetworkBackendInfo,
    /// The OCI runtime (crun, runc).
    #[serde(default, deserialize_with = "null_as_default")]
    pub oci_runtime: OciRuntime,
    /// podman talks to a service (`--remote`, `CONTAINER_HOST`, podman-remote), not to its own storage.
    #[serde(default)]
    pub service_is_remote: bool,
}

/// `info.host.networkBackendInfo` (podman 5).
#[derive(Debug, Default, Deserialize)]
pub struct NetworkBackendInfo {
    /// The DNS server's details.
    #[serde(default, deserialize_with = "null_as_default")]
    pub dns: Program,
}

/// A helper program podman reports: its version line and path.
#[derive(Debug, Default, Deserialize)]
pub struct Program {
    /// `aardvark-dns 1.16.0`.
    #[serde(default)]
    pub version: String,
    /// Where podman runs it from.
    #[serde(default)]
    pub path: String,
}

/// `info.host.ociRuntime`.
#[derive(Debug, Default, Deserialize)]
pub struct OciRuntime {
    /// `crun`, `runc`.
    #[serde(default)]
    pub name: String,
    /// Its version text (several lines; the first names the version).
    #[serde(default)]
    pub version: String,
}

/// `info.host.idMappings`: `null` lists when rootful.
#[derive(Debug, Default, Deserialize)]
pub struct IdMappings {
    /// uid ranges.
    #[serde(default, deserialize_with = "null_as_default")]
    pub uidmap: Vec<IdMap>,
    /// gid ranges.
    #[serde(default, deserialize_with = "null_as_default")]
    pub gidmap: Vec<IdMap>,
}

/// One mapped range.
#[derive(Debug, Default, Deserialize)]
pub struct IdMap {
    /// First id inside.
    #[serde(default)]
    pub container_id: u64,
    /// First id on the host.
    #[serde(default)]
    pub host_id: u64,
    /// How many ids.
    #[serde(default)]
    pub size: u64,
}

/// `info.host.security`.
#[derive(Debug, Default, Deserialize)]
pub struct Security {
    /// Rootless podman (the product's mode) or rootful.
    #[serde(default)]
    pub rootless: bool,
}

/// `info.host.remoteSocket`.
#[derive(Debug, Default, Deserialize)]
pub struct RemoteSocket {
    /// `unix:///…`, or a plain path.
    #[serde(default)]
    pub path: String,
}

/// `info.store`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Store {
    /// Image and container storage.
    #[serde(default)]
    pub graph_root: String,
    /// Runtime state.
    #[serde(default)]
    pub run_root: String,
    /// Named volumes.
    #[serde(default)]
    pub volume_path: String,
    /// storage.conf (podman 4 and 5; gone after 5.8).
    #[serde(default)]
    pub config_file: Option<String>,
    /// The storage driver: `overlay`, or `vfs`, which copies a whole image for every container.
    #[serde(default)]
    pub graph_driver_name: String,
    /// The driver's options from storage.conf: `overlay.imagestore` names storage.conf's
    /// `additionalimagestores` (images podman runs, kept outside the graph root), `overlay.mount_program`
    /// an object with the program's path.
    #[serde(default, deserialize_with = "null_as_default")]
    pub graph_options: HashMap<String, serde_json::Value>,
}

/// One network of `podman network inspect` or `podman network ls --format json` (netavark's
/// `types.Network`; podman 5's inspect adds keys the launcher does not read).
#[derive(Debug, Default, Deserialize)]
pub struct Network {
    /// Network name.
    #[serde(default)]
    pub name: String,
    /// Its labels (left out when there are none).
    #[serde(default, deserialize_with = "null_as_default")]
    pub labels: HashMap<String, String>,
    /// Its subnets (left out when there are none).
    #[serde(default, deserialize_with = "null_as_default")]
    pub subnets: Vec<Subnet>,
    /// Whether podman runs a DNS server (aardvark-dns) on it.
    #[serde(default)]
    pub dns_enabled: bool,
}

/// One subnet of a network.
#[derive(Debug, Default, Deserialize)]
pub struct Subnet {
    /// CIDR form, `10.89.3.0/24` or `fd00::/64`.
    #[serde(default)]
    pub subnet: String,
    /// The gateway's address (left out for some internal networks).
    #[serde(default)]
    pub gateway: Option<IpAddr>,
}

impl Network {
    /// Parses `podman network inspect NAME`: a list of one.
    pub fn parse_inspect(json: &str) -> Result<Network, JsonError> {
        let mut list: Vec<Network> = parse("network inspect", json)?;
        if list.is_empty() {
            return Err(JsonError {
                command: "network inspect",
                source: serde::de::Error::custom("no network in the answer"),
            });
        }
        Ok(list.swap_remove(0))
    }

    /// Parses `podman network ls --format json`.
    pub fn parse_list(json: &str) -> Result<Vec<Network>, JsonError> {
        parse::<Option<Vec<Network>>>("network ls --format json", json)
            .map(Option::unwrap_or_default)
    }

    /// The DNS servers podman runs for the network: port 53 on each gateway, if DNS is enabled on it.
    #[must_use]
    pub fn dns_servers(&self) -> Vec<SocketAddr> {
        if !self.dns_enabled {
            return Vec::new();
        }
        self.subnets
            .iter()
            .filter_map(|s| s.gateway)
            .map(|ip| SocketAddr::new(ip, 53))
            .collect()
    }
}

/// One image of `podman image inspect`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Image {
    /// Its tags, to tell the images of one answer apart.
    #[serde(default, deserialize_with = "null_as_default")]
    pub repo_tags: Vec<String>,
    /// Its labels (the launcher version that built it, for images `--build-images` made).
    #[serde(default, deserialize_with = "null_as_default")]
    pub labels: HashMap<String, String>,
    /// Its size in bytes (what the `vfs` driver copies for every container).
    #[serde(default)]
    pub size: u64,
}

impl Image {
    /// Parses `podman image inspect IMAGE...`.
    pub fn parse_inspect(json: &str) -> Result<Vec<Image>, JsonError> {
        parse::<Option<Vec<Image>>>("image inspect", json).map(Option::unwrap_or_default)
    }
}

/// One container of `podman ps --all --format json`.
#[derive(Debug, Default, Deserialize)]
pub struct Container {
    /// Its names (one, in practice).
    #[serde(rename = "Names", default, deserialize_with = "null_as_default")]
    pub names: Vec<String>,
    /// Its labels.
    #[serde(rename = "Labels", default, deserialize_with = "null_as_default")]
    pub labels: HashMap<String, String>,
}

impl Container {
    /// Parses `podman ps --format json`.
    pub fn parse_list(json: &str) -> Result<Vec<Container>, JsonError> {
        parse::<Option<Vec<Container>>>("ps --format json", json).map(Option::unwrap_or_default)
    }
}

/// One pod of `podman pod ps --format json`.
#[derive(Debug, Default, Deserialize)]
pub struct Pod {
    /// Pod name.
    #[serde(rename = "Name", default)]
    pub name: String,
    /// Its labels.
    #[serde(rename = "Labels", default, deserialize_with = "null_as_default")]
    pub labels: HashMap<String, String>,
}

impl Pod {
    /// Parses `podman pod ps --format json`.
    pub fn parse_list(json: &str) -> Result<Vec<Pod>, JsonError> {
        parse::<Option<Vec<Pod>>>("pod ps --format json", json).map(Option::unwrap_or_default)
    }
}

/// One volume of `podman volume ls --format json`.
#[derive(Debug, Default, Deserialize)]
pub struct Volume {
    /// Volume name.
    #[serde(rename = "Name", default)]
    pub name: String,
    /// Its labels.
    #[serde(rename = "Labels", default, deserialize_with = "null_as_default")]
    pub labels: HashMap<String, String>,
}

impl Volume {
    /// Parses `podman volume ls --format json`.
    pub fn parse_list(json: &str) -> Result<Vec<Volume>, JsonError> {
        parse::<Option<Vec<Volume>>>("volume ls --format json", json).map(Option::unwrap_or_default)
    }
}

/// `podman container inspect NAME`: where an initialised container's OCI configuration is.
#[derive(Debug, Default, Deserialize)]
pub struct ContainerInspect {
    /// Its full id.
    #[serde(rename = "Id", default)]
    pub id: String,
    /// The container's `config.json`, written by `podman init` (empty before), in its `userdata`
    /// directory under podman's storage root.
    #[serde(rename = "OCIConfigPath", default)]
    pub oci_config_path: PathBuf,
    /// Its `/etc/hostname`, in its `userdata` directory under podman's run root.
    #[serde(rename = "HostnamePath", default)]
    pub hostname_path: PathBuf,
}

impl ContainerInspect {
    /// Parses `podman container inspect NAME` (an array of one).
    pub fn parse(json: &str) -> Result<ContainerInspect, JsonError> {
        parse_one("container inspect", json)
    }
}

/// `podman volume inspect NAME`: what the volume is.
#[derive(Debug, Default, Deserialize)]
pub struct VolumeInspect {
    /// Its driver: `local` for podman's own volumes, a plugin's name otherwise.
    #[serde(rename = "Driver", default)]
    pub driver: String,
    /// Its directory on the host (what a container's mount of it names as its source).
    #[serde(rename = "Mountpoint", default)]
    pub mountpoint: PathBuf,
    /// Its `--opt`s: with `device`, `type` or `o`, podman mounts something (a host directory with
    /// `o=bind`) on its directory whenever a container uses it.
    #[serde(rename = "Options", default, deserialize_with = "null_as_default")]
    pub options: BTreeMap<String, String>,
}

impl VolumeInspect {
    /// Parses `podman volume inspect NAME` (an array of one).
    pub fn parse(json: &str) -> Result<VolumeInspect, JsonError> {
        parse_one("volume inspect", json)
    }
}

/// An `inspect` of one object: an array that must hold exactly one.
fn parse_one<T: DeserializeOwned>(command: &'static str, json: &str) -> Result<T, JsonError> {
    let mut all = parse::<Option<Vec<T>>>(command, json)?.unwrap_or_default();
    if all.len() != 1 {
        return Err(JsonError {
            command,
            source: serde::de::Error::custom(format!(
                "{} objects where one was asked for",
                all.len()
            )),
        });
    }
    Ok(all.remove(0))
}

/// The OCI runtime configuration podman wrote for a container (`config.json`): every mount the
/// runtime will make and every device node it will create, whatever added them (the command line,
/// containers.conf's `volumes`, `:O` overlays, mounts.conf, the image's volumes).
#[derive(Debug, Default, Deserialize)]
pub struct OciConfig {
    /// The mounts, in order.
    #[serde(default, deserialize_with = "null_as_default")]
    pub mounts: Vec<OciMount>,
    /// The Linux section.
    #[serde(default)]
    pub linux: OciLinux,
    /// Programs the runtime runs on the host around the container's life, by stage (`prestart`,
    /// `createRuntime`, …): from OCI hook files (`hooks_dir`), never from podman itself.
    #[serde(default, deserialize_with = "null_as_default")]
    pub hooks: HashMap<String, Option<Vec<serde_json::Value>>>,
}

/// One mount of an OCI configuration.
#[derive(Debug, Default, Deserialize, Clone, PartialEq, Eq)]
pub struct OciMount {
    /// Where it shows in the container.
    #[serde(default)]
    pub destination: PathBuf,
    /// `bind`, `proc`, `tmpfs`, `overlay`, …
    #[serde(rename = "type", default)]
    pub kind: String,
    /// The host path (for binds and overlays) or a file system name.
    #[serde(default)]
    pub source: PathBuf,
    /// Mount options (`ro`, `rbind`, …).
    #[serde(default, deserialize_with = "null_as_default")]
    pub options: Vec<String>,
}

/// The part of an OCI configuration's `linux` section the launcher reads.
#[derive(Debug, Default, Deserialize)]
pub struct OciLinux {
    /// Device nodes the runtime creates beyond its defaults.
    #[serde(default, deserialize_with = "null_as_default")]
    pub devices: Vec<serde_json::Value>,
    /// The namespaces the container gets: a new one, or (with a path) one it joins; a kind that is
    /// not listed is the host's.
    #[serde(default, deserialize_with = "null_as_default")]
    pub namespaces: Vec<OciNamespace>,
}

/// One namespace of an OCI configuration.
#[derive(Debug, Default, Deserialize, Clone, PartialEq, Eq)]
pub struct OciNamespace {
    /// `pid`, `mount`, `network`, `ipc`, `uts`, `user`, `cgroup`.
    #[serde(rename = "type", default)]
    pub kind: String,
    /// The namespace joined (another container's, the pod's), or empty for a new one.
    #[serde(default)]
    pub path: String,
}

impl OciConfig {
    /// Parses a container's `config.json`.
    pub fn parse(json: &str) -> Result<OciConfig, JsonError> {
        parse("init (the container's config.json)", json)
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::podman::LABEL_SESSION;

    /// The sample answers, per podman version (see launcher/tests/data/podman/README.md).
    macro_rules! sample {
        ($version:literal, $file:literal) => {
            include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/data/podman/",
                $version,
                "/",
                $file
            ))
        };
    }

    /// Both versions' samples of one answer.
    macro_rules! samples {
        ($file:literal) => {
            [
                ("4.3.1", sample!("4.3.1", $file)),
                ("5.8.2", sample!("5.8.2", $file)),
            ]
        };
    }

    #[test]
    fn info_rootful_of_each_version() {
        for (version, json) in samples!("info-rootful.json") {
            let info = Info::parse(json).unwrap();
            assert!(!info.host.security.rootless, "{version}");
            assert!(!info.subordinate_ids(), "{version}: null id mappings");
            assert_eq!(
                info.paths(),
                [
                    "/var/lib/containers/storage",
                    "/run/containers/storage",
                    "/var/lib/containers/storage/volumes",
                    "/usr/share/containers/storage.conf",
                    "/run/podman/podman.sock"
                ]
                .map(PathBuf::from),
                "{version}"
            );
        }
    }

    #[test]
    fn info_what_doctor_reads_of_each_version() {
        for (version, json, cgroup, runtime, dns) in [
            (
                "4.3.1",
                sample!("4.3.1", "info-rootful.json"),
                "v1",
                "runc",
                "",
            ),
            (
                "5.8.2",
                sample!("5.8.2", "info-rootful.json"),
                "v2",
                "crun",
                "aardvark-dns 1.16.0",
            ),
        ] {
            let info = Info::parse(json).unwrap();
            assert_eq!(info.version.version, version);
            assert_eq!(info.host.cgroup_version, cgroup, "{version}");
            assert_eq!(info.host.network_backend, "netavark", "{version}");
            assert_eq!(info.host.oci_runtime.name, runtime, "{version}");
            assert_eq!(info.host.network_backend_info.dns.version, dns, "{version}");
            assert_eq!(info.store.graph_driver_name, "overlay", "{version}");
            let stores = info.container_stores();
            assert_eq!(stores.len(), 2, "{version}");
            assert!(
                stores.iter().all(|s| s.ends_with("overlay-containers")),
                "{version}: {stores:?}"
            );
        }
    }

    #[test]
    fn image_inspect() {
        let json = r#"[{"Id":"2d9c","RepoTags":["localhost/agent-sandbox-router:dev"],"Size":6737593,
            "Labels":{"io.buildah.version":"1.28.2","agent-sandbox.version":"0.4.0"}},
            {"RepoTags":null,"Labels":null}]"#;
        let images = Image::parse_inspect(json).unwrap();
        assert_eq!(images[0].repo_tags, ["localhost/agent-sandbox-router:dev"]);
        assert_eq!(images[0].labels["agent-sandbox.version"], "0.4.0");
        assert_eq!(images[0].size, 6_737_593);
        assert!(images[1].labels.is_empty() && images[1].repo_tags.is_empty());
        assert!(Image::parse_inspect("garbage").is_err());
    }

    #[test]
    fn info_rootless_of_each_version() {
        for (version, json, uid, home, run) in [
            (
                "4.3.1",
                sample!("4.3.1", "info-rootless.json"),
                1001,
                "/home/agent-sandbox-e2e",
                "/tmp/podman-run-1001",
            ),
            (
                "5.8.2",
                sample!("5.8.2", "info-rootless.json"),
                1000,
                "/home/me",
                "/run/user/1000",
            ),
        ] {
            let info = Info::parse(json).unwrap();
            assert!(info.host.security.rootless, "{version}");
            assert!(info.subordinate_ids(), "{version}");
            assert_eq!(info.host.id_mappings.uidmap[0].host_id, uid, "{version}");
            let paths = info.paths();
            assert_eq!(
                paths[0],
                PathBuf::from(format!("{home}/.local/share/containers/storage")),
                "{version}"
            );
            assert_eq!(
                paths.last().unwrap(),
                &PathBuf::from(format!("{run}/podman/podman.sock")),
                "{version}"
            );
        }
    }

    #[test]
    fn info_without_the_keys_later_podman_drops() {
        // podman after 5.8: no store.configFile; remote clients: no remoteSocket.
        let info = Info::parse(
            r#"{"host":{"security":{"rootless":true},"idMappings":{"uidmap":[{"container_id":0,"host_id":1000,"size":1}],"gidmap":null}},
                "store":{"graphRoot":"/g","runRoot":"/r","volumePath":"/v"}}"#,
        )
        .unwrap();
        assert_eq!(info.paths(), ["/g", "/r", "/v"].map(PathBuf::from));
        assert!(!info.subordinate_ids());
        assert!(Info::parse("{}").is_ok());
        assert!(Info::parse(r#"{"host":null,"store":null}"#).is_ok());
        let err = Info::parse("not json").unwrap_err().to_string();
        assert!(
            err.starts_with("cannot parse `podman info --format json`"),
            "{err}"
        );
    }

    #[test]
    fn session_network_inspect_of_each_version() {
        for (version, json) in samples!("network-inspect-session.json") {
            let net = Network::parse_inspect(json).unwrap();
            assert_eq!(net.name, "agent-sandbox-0123456789ab", "{version}");
            assert_eq!(net.labels[LABEL_SESSION], "0123456789ab", "{version}");
            assert_eq!(net.subnets.len(), 1, "{version}");
            assert_eq!(net.subnets[0].subnet, "10.89.0.0/24", "{version}");
            // An internal network has no gateway on 4.3.
            assert_eq!(net.subnets[0].gateway, None, "{version}");
            assert!(net.dns_servers().is_empty(), "{version}: --disable-dns");
        }
    }

    #[test]
    fn egress_network_inspect_of_each_version() {
        for (version, json) in samples!("network-inspect-egress.json") {
            let net = Network::parse_inspect(json).unwrap();
            assert_eq!(
                net.subnets[0].gateway,
                Some(IpAddr::V4(Ipv4Addr::new(10, 89, 1, 1))),
                "{version}"
            );
            assert_eq!(
                net.dns_servers(),
                ["10.89.1.1:53".parse::<SocketAddr>().unwrap()],
                "{version}"
            );
        }
    }

    #[test]
    fn network_inspect_edge_cases() {
        // No subnets key (Go's omitempty), no labels, and an empty answer.
        let net = Network::parse_inspect(r#"[{"name":"n","dns_enabled":true}]"#).unwrap();
        assert!(net.subnets.is_empty() && net.labels.is_empty());
        assert!(net.dns_servers().is_empty());
        assert!(Network::parse_inspect("[]").is_err());
        assert!(Network::parse_inspect("garbage").is_err());
        let v6 = Network::parse_inspect(
            r#"[{"subnets":[{"subnet":"fd00::/64","gateway":"fd00::1"},{"subnet":"10.0.5.16/28","gateway":"10.0.5.17"}],"dns_enabled":true}]"#,
        )
        .unwrap();
        assert_eq!(v6.dns_servers().len(), 2);
    }

    #[test]
    fn listings_of_each_version() {
        for (version, json) in samples!("network-ls.json") {
            let nets = Network::parse_list(json).unwrap();
            assert_eq!(nets.len(), 1, "{version}");
            assert_eq!(nets[0].name, "agent-sandbox-0123456789ab", "{version}");
            assert_eq!(nets[0].labels[LABEL_SESSION], "0123456789ab", "{version}");
        }
        for (version, json) in samples!("ps.json") {
            let ctrs = Container::parse_list(json).unwrap();
            let names: Vec<&str> = ctrs.iter().map(|c| c.names[0].as_str()).collect();
            assert_eq!(
                names,
                ["53b87318151d-infra", "agent-sandbox-0123456789ab-router"],
                "{version}"
            );
            assert!(
                ctrs.iter()
                    .all(|c| c.labels[LABEL_SESSION] == "0123456789ab"),
                "{version}"
            );
        }
        for (version, json) in samples!("pod-ps.json") {
            let pods = Pod::parse_list(json).unwrap();
            assert_eq!(pods.len(), 1, "{version}");
            assert_eq!(pods[0].name, "agent-sandbox-0123456789ab", "{version}");
            assert_eq!(pods[0].labels[LABEL_SESSION], "0123456789ab", "{version}");
        }
    }

    #[test]
    fn empty_and_null_listings() {
        // podman prints `[]` for nothing, and Go's nil for a nil list; labels may be null.
        assert!(Pod::parse_list("[]").unwrap().is_empty());
        assert!(Pod::parse_list("null").unwrap().is_empty());
        assert!(Container::parse_list("null").unwrap().is_empty());
        assert!(Network::parse_list("null").unwrap().is_empty());
        let c = Container::parse_list(r#"[{"Names":["a"],"Labels":null}]"#).unwrap();
        assert!(c[0].labels.is_empty());
        assert!(Pod::parse_list("{").is_err());
        let huge = format!("[{}]", " ".repeat(MAX_JSON_BYTES));
        assert!(Pod::parse_list(&huge)
            .unwrap_err()
            .to_string()
            .contains("larger than"));
    }
}
