//! What an image says besides its files: environment, working directory, user, command.
//!
//! One type for every source of images: the OCI/Docker image config of a pulled image, an
//! offline recipe's defaults, and an image exported from a Docker engine. Builders take it
//! over as a container of the image would start (ENV, WORKDIR, CMD), and an import into a
//! Docker engine turns it back into `--change` instructions.

use serde::{Deserialize, Serialize};

/// What a builder takes over from an image besides its files.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    /// `NAME=value` entries, in the image's order.
    pub env: Vec<String>,
    pub workdir: Option<String>,
    /// `USER` (a name or `uid[:gid]`); None is root.
    pub user: Option<String>,
    pub cmd: Option<Vec<String>>,
    pub entrypoint: Option<Vec<String>>,
    /// TCP ports the image declares (`EXPOSE`).
    pub exposed_ports: Vec<u16>,
}

/// The `config` object of an OCI image config / Docker image JSON.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct OciConfig {
    #[serde(default)]
    env: Option<Vec<String>>,
    #[serde(default)]
    working_dir: Option<String>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    cmd: Option<Vec<String>>,
    #[serde(default)]
    entrypoint: Option<Vec<String>>,
    #[serde(default)]
    exposed_ports: Option<serde_json::Map<String, serde_json::Value>>,
}

#[derive(Debug, Deserialize)]
struct OciImage {
    #[serde(default)]
    config: Option<OciConfig>,
}

/// An image config blob that is not the JSON of an image config.
#[derive(Debug, thiserror::Error)]
#[error("the image config is not valid: {0}")]
pub struct InvalidImageConfig(#[source] pub serde_json::Error);

impl ImageConfig {
    /// From the JSON of an image config blob (`application/vnd.oci.image.config.v1+json`).
    pub fn from_oci_json(bytes: &[u8]) -> Result<Self, InvalidImageConfig> {
        let img: OciImage = serde_json::from_slice(bytes).map_err(InvalidImageConfig)?;
        let c = img.config.unwrap_or_default();
        let mut ports: Vec<u16> = c
            .exposed_ports
            .unwrap_or_default()
            .keys()
            .filter(|k| !k.ends_with("/udp"))
            .filter_map(|k| k.split('/').next().and_then(|p| p.parse().ok()))
            .collect();
        ports.sort_unstable();
        ports.dedup();
        Ok(Self {
            env: c.env.unwrap_or_default(),
            workdir: c.working_dir.filter(|w| !w.is_empty()),
            user: c.user.filter(|u| !u.is_empty()),
            cmd: c.cmd.filter(|c| !c.is_empty()),
            entrypoint: c.entrypoint.filter(|e| !e.is_empty()),
            exposed_ports: ports,
        })
    }

    /// `env` as a map (a later entry of a name wins, as in a container).
    pub fn env_map(&self) -> std::collections::BTreeMap<String, String> {
        self.env.iter().filter_map(|e| e.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// The value of `NAME` in `env`, if set.
    pub fn env_var(&self, name: &str) -> Option<&str> {
        self.env.iter().rev().find_map(|e| e.split_once('=').filter(|(k, _)| *k == name).map(|(_, v)| v))
    }

    /// The configuration as Dockerfile instructions (what `docker import --change` takes).
    pub fn docker_changes(&self) -> Vec<String> {
        let q = |s: &str| serde_json::to_string(s).expect("a string serializes");
        let list = |v: &[String]| serde_json::to_string(v).expect("strings serialize");
        let mut out = Vec::new();
        for e in &self.env {
            if let Some((k, v)) = e.split_once('=') {
                out.push(format!("ENV {k}={}", q(v)));
            }
        }
        if let Some(w) = &self.workdir {
            out.push(format!("WORKDIR {w}"));
        }
        if let Some(u) = &self.user {
            out.push(format!("USER {u}"));
        }
        for p in &self.exposed_ports {
            out.push(format!("EXPOSE {p}"));
        }
        if let Some(e) = &self.entrypoint {
            out.push(format!("ENTRYPOINT {}", list(e)));
        }
        if let Some(c) = &self.cmd {
            out.push(format!("CMD {}", list(c)));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_an_oci_config() {
        let json = br#"{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/usr/bin","A=b c"],
            "WorkingDir":"/app","User":"1000","Cmd":["python3"],"ExposedPorts":{"8000/tcp":{},"53/udp":{}}},
            "rootfs":{"type":"layers","diff_ids":[]}}"#;
        let c = ImageConfig::from_oci_json(json).unwrap();
        assert_eq!(c.env, vec!["PATH=/usr/bin", "A=b c"]);
        assert_eq!(c.workdir.as_deref(), Some("/app"));
        assert_eq!(c.user.as_deref(), Some("1000"));
        assert_eq!(c.cmd, Some(vec!["python3".to_string()]));
        assert_eq!(c.exposed_ports, vec![8000]);
        assert_eq!(c.env_var("A"), Some("b c"));
        let twice = ImageConfig { env: vec!["A=1".into(), "junk".into(), "A=2=x".into()], ..c.clone() };
        assert_eq!(twice.env_map(), [("A".to_string(), "2=x".to_string())].into());
        assert_eq!(ImageConfig::from_oci_json(b"{}").unwrap(), ImageConfig::default());
    }

    /// Issue 28 item 4: a bad blob keeps serde's error, and reads as it did.
    #[test]
    fn a_bad_blob_keeps_the_parse_error() {
        let e = ImageConfig::from_oci_json(b"{\"config\": 3}").unwrap_err();
        assert!(e.0.is_data(), "{e:?}");
        assert!(e.to_string().starts_with("the image config is not valid: invalid type: integer `3`"), "{e}");
        assert!(ImageConfig::from_oci_json(b"{").unwrap_err().0.is_eof());
    }

    #[test]
    fn becomes_docker_changes() {
        let c = ImageConfig {
            env: vec!["A=b \"c\"".into()],
            workdir: Some("/w".into()),
            cmd: Some(vec!["sh".into(), "-c".into(), "echo hi".into()]),
            exposed_ports: vec![9000],
            ..Default::default()
        };
        assert_eq!(
            c.docker_changes(),
            vec!["ENV A=\"b \\\"c\\\"\"", "WORKDIR /w", "EXPOSE 9000", "CMD [\"sh\",\"-c\",\"echo hi\"]"]
        );
    }
}
