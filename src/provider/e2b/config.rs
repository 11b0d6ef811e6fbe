//! Presets and configuration of the E2B-protocol client: which API, which sandbox domain,
//! which key, which create route, and how envd and port URLs are built from them.
//!
//! Everything is read from the env map the caller hands over (process environment over
//! `.env`), never from `std::env` directly, so tests and the runner see the same thing.
//!
//! # Variables and precedence
//!
//! | what | `--provider alicloud` | `--provider e2b` |
//! |---|---|---|
//! | API key | `ABX_SANDBOX_API_KEY`, then `E2B_API_KEY` | `E2B_API_KEY` |
//! | API base URL | `ABX_SANDBOX_BASE_URL`, then `E2B_API_URL`, else `https://api.{domain}` | `E2B_API_URL`, else `https://api.{domain}` |
//! | sandbox domain | `ABX_SANDBOX_DOMAIN`, then `E2B_DOMAIN`, else `{region}.e2b.fc.aliyuncs.com` with region `ALIBABA_CLOUD_REGION_ID` (default `cn-hangzhou`) | `E2B_DOMAIN`, else `e2b.app` |
//! | envd URL for every sandbox | `E2B_SANDBOX_URL` | `E2B_SANDBOX_URL` |
//! | create/connect route | `E2B_SANDBOX_CREATE_API=v1\|v2`, default `v1` | same variable, default `v2` |
//! | control-plane auth header | `Authorization: Bearer <key>` | `X-API-KEY: <key>` |
//! | port URLs | `SCENARIO_RUN_E2B_PORT_URL` (a template, see below) | same |
//! | ACR for image templates ([`Acr`]) | `SCENARIO_RUN_ACR_REGISTRY`, `SCENARIO_RUN_ACR_PULL_REGISTRY`, `ACR_USERNAME`/`ACR_PASSWORD` (or `SCENARIO_RUN_ACR_USERNAME`/`_PASSWORD`), else `ALIBABA_CLOUD_ACCESS_KEY_ID`/`_SECRET` with `SCENARIO_RUN_ACR_INSTANCE_ID` and `SCENARIO_RUN_ACR_API_ENDPOINT` | not read |
//!
//! Empty values count as unset. The `e2b` preset deliberately ignores the `ABX_*` variables,
//! so an Alibaba key is never sent to E2B's API; the `alicloud` preset falls back to the
//! `E2B_*` names because Alibaba's own quickstarts set those.
//!
//! FC needs v1 create/connect: Alibaba's compatibility page says the `/v2/sandboxes` routes
//! (E2B SDK ≥ 2.51) are not served yet (protocol doc §2.3, §11).
//!
//! # URLs
//!
//! * envd (protocol doc §1): `E2B_SANDBOX_URL` verbatim if set; else `https://sandbox.{domain}`
//!   for E2B's own domains (a shared edge that routes by the `E2b-Sandbox-Id` header); else
//!   `https://49983-{id}.{domain}`. The domain is the one the API returned for the sandbox,
//!   else the configured one.
//! * ports (§7): `https://{port}-{id}.{domain}`.
//! * Local servers: when the domain is a loopback name (`localhost`, `*.localhost`,
//!   `127.x.x.x`, `[::1]`, with or without `:port`) both use `http://` instead, since a local
//!   E2B-compatible server (`scenario-run serve`) speaks plain HTTP. This is the one
//!   deliberate difference from the SDK, which would use `https` and fail there.
//! * `SCENARIO_RUN_E2B_PORT_URL` (ours, not the SDK's) replaces the port URL rule with a
//!   template whose `{port}`, `{id}` and `{domain}` are filled in, e.g.
//!   `http://{port}-{id}.localhost:3000` or `http://127.0.0.1:3000/sandboxes/{id}/ports/{port}`.
//!   A local server needs it when its port routing is not reachable by host name: plain
//!   glibc does not resolve `*.localhost`.

use std::collections::BTreeMap;
use std::fmt;

use crate::provider::{ProviderError, Result};

/// The envd port inside every sandbox.
pub const ENVD_PORT: u16 = 49983;

/// Domains served by E2B's shared sandbox edge (`sandbox_domains.py` in the SDK).
const SHARED_EDGE_DOMAINS: &[&str] =
    &["e2b.app", "e2b.dev", "e2b.pro", "e2b-staging.dev", "e2b-tango.dev", "e2b-juliett.dev", "foxtrot-2.e2b.dev"];

/// Which platform `--provider` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// E2B's own cloud (`api.e2b.app`).
    E2b,
    /// Alibaba Cloud Function Compute "Agent Sandbox", which speaks the E2B protocol.
    Alicloud,
}

impl Preset {
    pub fn name(self) -> &'static str {
        match self {
            Preset::E2b => "e2b",
            Preset::Alicloud => "alicloud",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "e2b" => Some(Preset::E2b),
            "alicloud" => Some(Preset::Alicloud),
            _ => None,
        }
    }

    /// The variable users are told to set when no key is configured.
    pub fn key_var(self) -> &'static str {
        match self {
            Preset::E2b => "E2B_API_KEY",
            Preset::Alicloud => "ABX_SANDBOX_API_KEY",
        }
    }
}

/// Which create/connect routes the control plane serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateApi {
    /// `POST /sandboxes`, `POST /sandboxes/{id}/connect` (SDK ≤ 2.50; FC).
    V1,
    /// `POST /v2/sandboxes`, `POST /v2/sandboxes/{id}/connect` (SDK ≥ 2.51).
    V2,
}

/// How the API key travels on control-plane calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthStyle {
    /// `X-API-KEY: <key>`, what the E2B SDK sends.
    ApiKeyHeader,
    /// `Authorization: Bearer <key>`, what Alibaba's native client sends.
    Bearer,
}

/// The settled configuration of one provider. `Debug` never shows the key.
#[derive(Clone)]
pub struct Config {
    pub preset: Preset,
    /// Control-plane base URL, without a trailing slash.
    pub api_url: String,
    /// Sandbox domain used when the API does not name one.
    pub domain: String,
    /// `E2B_SANDBOX_URL`: one envd base URL for all sandboxes.
    pub sandbox_url: Option<String>,
    pub create_api: CreateApi,
    pub auth: AuthStyle,
    /// `SCENARIO_RUN_E2B_PORT_URL`: the pattern of port URLs (`{port}`, `{id}`, `{domain}`).
    pub port_url_template: Option<String>,
    /// Alibaba ACR settings for templates built from a pushed image (alicloud only).
    pub acr: Option<Acr>,
    api_key: Option<String>,
}

/// Where the alicloud preset pushes template images, and how it logs in (the ACR path of
/// `build`/`deploy`, see the `acr` module):
///
/// * `SCENARIO_RUN_ACR_REGISTRY`: `<registry host>/<namespace>`, where images are pushed
///   (e.g. `xxx-registry.cn-beijing.cr.aliyuncs.com/ns`);
/// * `SCENARIO_RUN_ACR_PULL_REGISTRY`: the same repository as the platform reaches it (FC
///   wants the VPC address, `xxx-registry-vpc.cn-beijing.cr.aliyuncs.com/ns`); default the
///   push address;
/// * the login ([`AcrLogin`]): `ACR_USERNAME` and `ACR_PASSWORD` (also read as
///   `SCENARIO_RUN_ACR_USERNAME`/`_PASSWORD`, the names before), else a temporary login that
///   ACR's `GetAuthorizationToken` gives for the AccessKey pair `ALIBABA_CLOUD_ACCESS_KEY_ID` /
///   `ALIBABA_CLOUD_ACCESS_KEY_SECRET` and the Enterprise instance `SCENARIO_RUN_ACR_INSTANCE_ID`
///   (asked of `SCENARIO_RUN_ACR_API_ENDPOINT`, default `https://cr.<region>.aliyuncs.com`, the
///   region that of the registry host, else `ALIBABA_CLOUD_REGION_ID`); with neither, no login.
#[derive(Clone)]
pub struct Acr {
    pub registry: String,
    pub pull_registry: String,
    pub login: AcrLogin,
}

/// How the ACR path logs in to the registry.
#[derive(Clone, PartialEq, Eq)]
pub enum AcrLogin {
    /// A registry without authentication.
    None,
    /// A fixed registry login (`ACR_USERNAME`/`ACR_PASSWORD`).
    Password { username: String, password: String },
    /// A temporary login asked of ACR's OpenAPI with the AccessKey pair.
    AccessKey { key_id: String, key_secret: String, instance_id: String, endpoint: String },
}

impl fmt::Debug for Acr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Acr")
            .field("registry", &self.registry)
            .field("pull_registry", &self.pull_registry)
            .field("login", &self.login)
            .finish()
    }
}

impl fmt::Debug for AcrLogin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AcrLogin::None => f.write_str("None"),
            AcrLogin::Password { username, .. } => {
                f.debug_struct("Password").field("username", username).field("password", &"<redacted>").finish()
            }
            AcrLogin::AccessKey { instance_id, endpoint, .. } => f
                .debug_struct("AccessKey")
                .field("key_id", &"<redacted>")
                .field("key_secret", &"<redacted>")
                .field("instance_id", instance_id)
                .field("endpoint", endpoint)
                .finish(),
        }
    }
}

/// The region in an ACR registry host (`<instance>-registry[-vpc].<region>.cr.aliyuncs.com`).
fn acr_region(registry: &str) -> Option<&str> {
    let host = registry.split('/').next()?;
    let rest = host.strip_suffix(".cr.aliyuncs.com")?;
    let region = rest.rsplit('.').next()?;
    (region != rest && !region.is_empty()).then_some(region)
}

fn acr_from_env(env: &BTreeMap<String, String>, registry: &str, region: &str) -> Result<Acr> {
    let registry = registry.trim_end_matches('/').to_string();
    let user = get(env, &["ACR_USERNAME", "SCENARIO_RUN_ACR_USERNAME"]);
    let pass = get(env, &["ACR_PASSWORD", "SCENARIO_RUN_ACR_PASSWORD"]);
    let login = match (user, pass) {
        (Some(u), Some(p)) => AcrLogin::Password { username: u.to_string(), password: p.to_string() },
        (Some(_), None) | (None, Some(_)) => {
            return Err(ProviderError::invalid(
                "ACR_USERNAME and ACR_PASSWORD go together: set both (or neither, to log in with the AccessKey pair)",
            ))
        }
        (None, None) => {
            match (get(env, &["ALIBABA_CLOUD_ACCESS_KEY_ID"]), get(env, &["ALIBABA_CLOUD_ACCESS_KEY_SECRET"])) {
                (Some(id), Some(secret)) => {
                    let Some(instance_id) = get(env, &["SCENARIO_RUN_ACR_INSTANCE_ID"]) else {
                        return Err(ProviderError::invalid(
                            "the ACR login from ALIBABA_CLOUD_ACCESS_KEY_ID/_SECRET needs SCENARIO_RUN_ACR_INSTANCE_ID \
                             (the ACR Enterprise instance, cri-…) for GetAuthorizationToken; or set ACR_USERNAME/ACR_PASSWORD",
                        ));
                    };
                    let region = acr_region(&registry).unwrap_or(region);
                    let endpoint = match get(env, &["SCENARIO_RUN_ACR_API_ENDPOINT"]) {
                        Some(e) if e.contains("://") => check_url("SCENARIO_RUN_ACR_API_ENDPOINT", e)?,
                        Some(e) => check_url("SCENARIO_RUN_ACR_API_ENDPOINT", &format!("https://{e}"))?,
                        None => format!("https://cr.{region}.aliyuncs.com"),
                    };
                    AcrLogin::AccessKey {
                        key_id: id.to_string(),
                        key_secret: secret.to_string(),
                        instance_id: instance_id.to_string(),
                        endpoint,
                    }
                }
                _ => AcrLogin::None,
            }
        }
    };
    Ok(Acr {
        pull_registry: get(env, &["SCENARIO_RUN_ACR_PULL_REGISTRY"])
            .map_or_else(|| registry.clone(), |p| p.trim_end_matches('/').to_string()),
        registry,
        login,
    })
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("preset", &self.preset)
            .field("api_url", &self.api_url)
            .field("domain", &self.domain)
            .field("sandbox_url", &self.sandbox_url)
            .field("create_api", &self.create_api)
            .field("auth", &self.auth)
            .field("port_url_template", &self.port_url_template)
            .field("acr", &self.acr)
            .field("api_key", &if self.api_key.is_some() { "<redacted>" } else { "<unset>" })
            .finish()
    }
}

fn get<'a>(env: &'a BTreeMap<String, String>, names: &[&str]) -> Option<&'a str> {
    names.iter().filter_map(|n| env.get(*n)).map(|v| v.trim()).find(|v| !v.is_empty())
}

impl Config {
    /// Reads the configuration of `preset` from `env`. A missing key is not an error here
    /// (see [`Config::required_credentials`]); a malformed setting is.
    pub fn from_env(preset: Preset, env: &BTreeMap<String, String>) -> Result<Self> {
        let (key, url, domain) = match preset {
            Preset::E2b => (
                get(env, &["E2B_API_KEY"]),
                get(env, &["E2B_API_URL"]),
                get(env, &["E2B_DOMAIN"]).unwrap_or("e2b.app").to_string(),
            ),
            Preset::Alicloud => {
                let region = get(env, &["ALIBABA_CLOUD_REGION_ID"]).unwrap_or("cn-hangzhou");
                if !region.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
                    return Err(ProviderError::invalid(format!(
                        "invalid ALIBABA_CLOUD_REGION_ID `{region}`: expected a region id such as cn-hangzhou"
                    )));
                }
                (
                    get(env, &["ABX_SANDBOX_API_KEY", "E2B_API_KEY"]),
                    get(env, &["ABX_SANDBOX_BASE_URL", "E2B_API_URL"]),
                    get(env, &["ABX_SANDBOX_DOMAIN", "E2B_DOMAIN"])
                        .map(str::to_string)
                        .unwrap_or_else(|| format!("{region}.e2b.fc.aliyuncs.com")),
                )
            }
        };
        let domain = domain.trim_end_matches('/').to_string();
        let api_url = match url {
            Some(u) => check_url("API base URL", u)?,
            None => format!("https://api.{domain}"),
        };
        let sandbox_url = get(env, &["E2B_SANDBOX_URL"]).map(|u| check_url("E2B_SANDBOX_URL", u)).transpose()?;
        let create_api = match get(env, &["E2B_SANDBOX_CREATE_API"]) {
            None => match preset {
                Preset::E2b => CreateApi::V2,
                Preset::Alicloud => CreateApi::V1,
            },
            Some(v) if v.eq_ignore_ascii_case("v1") => CreateApi::V1,
            Some(v) if v.eq_ignore_ascii_case("v2") => CreateApi::V2,
            Some(v) => {
                return Err(ProviderError::invalid(format!("invalid E2B_SANDBOX_CREATE_API `{v}`: use v1 or v2")))
            }
        };
        let auth = match preset {
            Preset::E2b => AuthStyle::ApiKeyHeader,
            Preset::Alicloud => AuthStyle::Bearer,
        };
        let port_url_template = get(env, &["SCENARIO_RUN_E2B_PORT_URL"]).map(str::to_string);
        if let Some(t) = &port_url_template {
            if !t.contains("{port}") || !(t.starts_with("http://") || t.starts_with("https://")) {
                return Err(ProviderError::invalid(format!(
                    "invalid SCENARIO_RUN_E2B_PORT_URL `{t}`: expected an http(s) URL template containing {{port}}"
                )));
            }
        }
        let acr = match preset {
            Preset::Alicloud => {
                let region = get(env, &["ALIBABA_CLOUD_REGION_ID"]).unwrap_or("cn-hangzhou");
                get(env, &["SCENARIO_RUN_ACR_REGISTRY"]).map(|r| acr_from_env(env, r, region)).transpose()?
            }
            Preset::E2b => None,
        };
        Ok(Self {
            acr,
            preset,
            api_url,
            domain,
            sandbox_url,
            create_api,
            auth,
            port_url_template,
            api_key: key.map(str::to_string),
        })
    }

    /// The same configuration with another key.
    pub fn with_api_key(&self, key: &str) -> Config {
        Config { api_key: Some(key.to_string()), ..self.clone() }
    }

    pub fn api_key(&self) -> Option<&str> {
        self.api_key.as_deref()
    }

    /// What a client reads to reach this platform: the E2B SDKs' `E2B_API_KEY`,
    /// `E2B_API_URL`, `E2B_DOMAIN` (and `E2B_SANDBOX_URL` when one is set); for alicloud also
    /// the product client's `ABX_SANDBOX_API_KEY`, `ABX_SANDBOX_BASE_URL`,
    /// `ABX_SANDBOX_DOMAIN`, with the same values. The key is the configured one (unset without).
    pub fn client_env(&self) -> BTreeMap<String, String> {
        let mut env = BTreeMap::new();
        let mut put = |k: &str, v: &str| {
            env.insert(k.to_string(), v.to_string());
        };
        if let Some(key) = &self.api_key {
            put("E2B_API_KEY", key);
        }
        put("E2B_API_URL", &self.api_url);
        put("E2B_DOMAIN", &self.domain);
        if let Some(u) = &self.sandbox_url {
            put("E2B_SANDBOX_URL", u);
        }
        if self.preset == Preset::Alicloud {
            if let Some(key) = &self.api_key {
                put("ABX_SANDBOX_API_KEY", key);
            }
            put("ABX_SANDBOX_BASE_URL", &self.api_url);
            put("ABX_SANDBOX_DOMAIN", &self.domain);
        }
        env
    }

    /// The key variable to ask for, when no key is configured.
    pub fn required_credentials(&self) -> Vec<String> {
        if self.api_key.is_some() {
            Vec::new()
        } else {
            vec![self.preset.key_var().to_string()]
        }
    }

    /// Base URL of envd for sandbox `id`, whose API-reported domain is `domain` (if any).
    pub fn envd_url(&self, id: &str, domain: Option<&str>) -> String {
        if let Some(u) = &self.sandbox_url {
            return u.clone();
        }
        let domain = domain.filter(|d| !d.is_empty()).unwrap_or(&self.domain);
        if SHARED_EDGE_DOMAINS.contains(&domain) {
            return format!("https://sandbox.{domain}");
        }
        format!("{}://{ENVD_PORT}-{id}.{domain}", scheme(domain))
    }

    /// Base URL at which a client reaches `port` inside sandbox `id` (`E2B_SANDBOX_URL`
    /// does not affect it, as in the SDK).
    pub fn port_url(&self, id: &str, domain: Option<&str>, port: u16) -> String {
        let domain = domain.filter(|d| !d.is_empty()).unwrap_or(&self.domain);
        if let Some(t) = &self.port_url_template {
            return t.replace("{port}", &port.to_string()).replace("{id}", id).replace("{domain}", domain);
        }
        format!("{}://{port}-{id}.{domain}", scheme(domain))
    }
}

fn check_url(what: &str, u: &str) -> Result<String> {
    let u = u.trim_end_matches('/');
    if !(u.starts_with("http://") || u.starts_with("https://")) || u.len() <= "https://".len() {
        return Err(ProviderError::invalid(format!("invalid {what} `{u}`: expected http(s)://host[:port]")));
    }
    Ok(u.to_string())
}

/// `http` for loopback domains (a local server), `https` otherwise.
fn scheme(domain: &str) -> &'static str {
    if is_loopback(domain) {
        "http"
    } else {
        "https"
    }
}

fn is_loopback(domain: &str) -> bool {
    let host = if let Some(rest) = domain.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        domain.rsplit_once(':').filter(|(_, p)| p.chars().all(|c| c.is_ascii_digit())).map_or(domain, |(h, _)| h)
    };
    host == "localhost" || host.ends_with(".localhost") || host == "::1" || host.starts_with("127.")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// `provider.env`: what the SDKs and the product client read, from the settled config.
    #[test]
    fn client_env_names_what_each_client_reads() {
        let vars = env(&[
            ("E2B_API_KEY", "e2b-key-value"),
            ("ABX_SANDBOX_API_KEY", "abx-key-value"),
            ("E2B_SANDBOX_URL", "http://127.0.0.1:3000"),
            ("ALIBABA_CLOUD_REGION_ID", "cn-beijing"),
        ]);
        let e2b = Config::from_env(Preset::E2b, &vars).unwrap().client_env();
        assert_eq!(
            e2b,
            env(&[
                ("E2B_API_KEY", "e2b-key-value"),
                ("E2B_API_URL", "https://api.e2b.app"),
                ("E2B_DOMAIN", "e2b.app"),
                ("E2B_SANDBOX_URL", "http://127.0.0.1:3000"),
            ]),
            "the e2b preset never hands out an Alibaba key"
        );
        let ali = Config::from_env(Preset::Alicloud, &vars).unwrap().client_env();
        assert_eq!(ali["ABX_SANDBOX_API_KEY"], "abx-key-value");
        assert_eq!(ali["E2B_API_KEY"], "abx-key-value", "the E2B SDK against FC uses the same key");
        assert_eq!(ali["ABX_SANDBOX_BASE_URL"], "https://api.cn-beijing.e2b.fc.aliyuncs.com");
        assert_eq!(ali["E2B_API_URL"], ali["ABX_SANDBOX_BASE_URL"]);
        assert_eq!(
            (ali["ABX_SANDBOX_DOMAIN"].as_str(), ali["E2B_DOMAIN"].as_str()),
            ("cn-beijing.e2b.fc.aliyuncs.com", "cn-beijing.e2b.fc.aliyuncs.com")
        );
        let keyless = Config::from_env(Preset::E2b, &BTreeMap::new()).unwrap().client_env();
        assert!(!keyless.contains_key("E2B_API_KEY"), "{keyless:?}");
    }

    #[test]
    fn acr_settings_are_alicloud_only_and_the_secrets_are_hidden() {
        let vars = env(&[
            ("SCENARIO_RUN_ACR_REGISTRY", "r-registry.cn-beijing.cr.aliyuncs.com/ns/"),
            ("ALIBABA_CLOUD_ACCESS_KEY_ID", "LTAIid-value"),
            ("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "s3cr3t-value"),
            ("SCENARIO_RUN_ACR_INSTANCE_ID", "cri-abc"),
        ]);
        let c = Config::from_env(Preset::Alicloud, &vars).unwrap();
        let acr = c.acr.as_ref().unwrap();
        assert_eq!(acr.registry, "r-registry.cn-beijing.cr.aliyuncs.com/ns");
        assert_eq!(acr.pull_registry, acr.registry);
        // The AccessKey pair is never a registry login: it asks ACR for one, in the registry's region.
        assert_eq!(
            acr.login,
            AcrLogin::AccessKey {
                key_id: "LTAIid-value".into(),
                key_secret: "s3cr3t-value".into(),
                instance_id: "cri-abc".into(),
                endpoint: "https://cr.cn-beijing.aliyuncs.com".into(),
            }
        );
        let shown = format!("{c:?}");
        assert!(!shown.contains("s3cr3t-value") && !shown.contains("LTAIid-value"), "{shown}");
        assert!(Config::from_env(Preset::E2b, &vars).unwrap().acr.is_none());

        // The endpoint is configurable (a host, or a URL for a local stub); the region
        // falls back to ALIBABA_CLOUD_REGION_ID for a registry host that names none.
        let mut v = vars.clone();
        v.insert("SCENARIO_RUN_ACR_REGISTRY".into(), "localhost:5001/ns".into());
        v.insert("ALIBABA_CLOUD_REGION_ID".into(), "ap-southeast-1".into());
        let endpoint =
            |v: &BTreeMap<String, String>| match Config::from_env(Preset::Alicloud, v).unwrap().acr.unwrap().login {
                AcrLogin::AccessKey { endpoint, .. } => endpoint,
                other => panic!("{other:?}"),
            };
        assert_eq!(endpoint(&v), "https://cr.ap-southeast-1.aliyuncs.com");
        v.insert("SCENARIO_RUN_ACR_API_ENDPOINT".into(), "http://127.0.0.1:9/".into());
        assert_eq!(endpoint(&v), "http://127.0.0.1:9");
        v.insert("SCENARIO_RUN_ACR_API_ENDPOINT".into(), "cr-vpc.cn-beijing.aliyuncs.com".into());
        assert_eq!(endpoint(&v), "https://cr-vpc.cn-beijing.aliyuncs.com");

        // Without the instance the AccessKey pair cannot be turned into a login: said, not guessed.
        let mut v = vars.clone();
        v.remove("SCENARIO_RUN_ACR_INSTANCE_ID");
        let e = Config::from_env(Preset::Alicloud, &v).unwrap_err();
        assert!(e.message.contains("SCENARIO_RUN_ACR_INSTANCE_ID") && !e.message.contains("s3cr3t"), "{}", e.message);

        // A registry login wins over the AccessKey pair; ACR_* first, SCENARIO_RUN_ACR_* as aliases.
        let mut v = vars.clone();
        v.extend(env(&[
            ("SCENARIO_RUN_ACR_USERNAME", "old-robot"),
            ("SCENARIO_RUN_ACR_PASSWORD", "old-pw-value"),
            ("SCENARIO_RUN_ACR_PULL_REGISTRY", "r-registry-vpc.internal/ns"),
        ]));
        let acr = Config::from_env(Preset::Alicloud, &v).unwrap().acr.unwrap();
        assert_eq!(acr.login, AcrLogin::Password { username: "old-robot".into(), password: "old-pw-value".into() });
        assert_eq!(acr.pull_registry, "r-registry-vpc.internal/ns");
        assert!(!format!("{acr:?}").contains("old-pw-value"));
        v.extend(env(&[("ACR_USERNAME", "robot"), ("ACR_PASSWORD", "pw-value")]));
        let acr = Config::from_env(Preset::Alicloud, &v).unwrap().acr.unwrap();
        assert_eq!(acr.login, AcrLogin::Password { username: "robot".into(), password: "pw-value".into() });

        // Half a login is a mistake, not "no login".
        let v = env(&[("SCENARIO_RUN_ACR_REGISTRY", "localhost:5001/ns"), ("ACR_USERNAME", "robot")]);
        assert!(Config::from_env(Preset::Alicloud, &v).unwrap_err().message.contains("ACR_PASSWORD"));
        // Nothing set: a registry without authentication.
        let v = env(&[("SCENARIO_RUN_ACR_REGISTRY", "localhost:5000/ns")]);
        assert_eq!(Config::from_env(Preset::Alicloud, &v).unwrap().acr.unwrap().login, AcrLogin::None);
    }

    #[test]
    fn e2b_defaults() {
        let c = Config::from_env(Preset::E2b, &env(&[])).unwrap();
        assert_eq!(c.api_url, "https://api.e2b.app");
        assert_eq!(c.domain, "e2b.app");
        assert_eq!(c.create_api, CreateApi::V2);
        assert_eq!(c.auth, AuthStyle::ApiKeyHeader);
        assert_eq!(c.required_credentials(), vec!["E2B_API_KEY"]);
        // E2B's own domain goes through the shared edge, routed by headers.
        assert_eq!(c.envd_url("abc", None), "https://sandbox.e2b.app");
        assert_eq!(c.port_url("abc", None, 8080), "https://8080-abc.e2b.app");
    }

    #[test]
    fn alicloud_defaults_and_region() {
        let c = Config::from_env(Preset::Alicloud, &env(&[])).unwrap();
        assert_eq!(c.api_url, "https://api.cn-hangzhou.e2b.fc.aliyuncs.com");
        assert_eq!(c.domain, "cn-hangzhou.e2b.fc.aliyuncs.com");
        assert_eq!(c.create_api, CreateApi::V1);
        assert_eq!(c.auth, AuthStyle::Bearer);
        assert_eq!(c.required_credentials(), vec!["ABX_SANDBOX_API_KEY"]);
        assert_eq!(c.envd_url("abc", None), "https://49983-abc.cn-hangzhou.e2b.fc.aliyuncs.com");
        assert_eq!(c.port_url("abc", None, 8080), "https://8080-abc.cn-hangzhou.e2b.fc.aliyuncs.com");

        let c = Config::from_env(Preset::Alicloud, &env(&[("ALIBABA_CLOUD_REGION_ID", "ap-southeast-1")])).unwrap();
        assert_eq!(c.api_url, "https://api.ap-southeast-1.e2b.fc.aliyuncs.com");
        assert!(Config::from_env(Preset::Alicloud, &env(&[("ALIBABA_CLOUD_REGION_ID", "a/b")])).is_err());
    }

    #[test]
    fn alicloud_prefers_abx_names_then_e2b_names() {
        let e = env(&[
            ("ABX_SANDBOX_API_KEY", "abx-key"),
            ("E2B_API_KEY", "e2b-key"),
            ("E2B_API_URL", "https://e2b.example"),
            ("ABX_SANDBOX_DOMAIN", "abx.example"),
            ("E2B_DOMAIN", "e2b-domain.example"),
        ]);
        let c = Config::from_env(Preset::Alicloud, &e).unwrap();
        assert_eq!(c.api_key(), Some("abx-key"));
        assert_eq!(c.api_url, "https://e2b.example");
        assert_eq!(c.domain, "abx.example");
        assert!(c.required_credentials().is_empty());

        let c = Config::from_env(Preset::Alicloud, &env(&[("E2B_API_KEY", "e2b-key"), ("ABX_SANDBOX_API_KEY", "")]))
            .unwrap();
        assert_eq!(c.api_key(), Some("e2b-key"), "empty counts as unset");
    }

    #[test]
    fn e2b_ignores_abx_names() {
        let e = env(&[("ABX_SANDBOX_API_KEY", "abx-key"), ("ABX_SANDBOX_BASE_URL", "https://abx.example")]);
        let c = Config::from_env(Preset::E2b, &e).unwrap();
        assert_eq!(c.api_key(), None);
        assert_eq!(c.api_url, "https://api.e2b.app");
    }

    #[test]
    fn api_url_follows_domain_and_override() {
        let c = Config::from_env(Preset::E2b, &env(&[("E2B_DOMAIN", "example.org")])).unwrap();
        assert_eq!(c.api_url, "https://api.example.org");
        assert_eq!(c.envd_url("abc", None), "https://49983-abc.example.org");
        // The domain the API returns wins over the configured one.
        assert_eq!(c.envd_url("abc", Some("other.net")), "https://49983-abc.other.net");
        let c = Config::from_env(Preset::E2b, &env(&[("E2B_API_URL", "http://127.0.0.1:3000/")])).unwrap();
        assert_eq!(c.api_url, "http://127.0.0.1:3000");
        assert!(Config::from_env(Preset::E2b, &env(&[("E2B_API_URL", "127.0.0.1:3000")])).is_err());
    }

    #[test]
    fn sandbox_url_overrides_envd_but_not_ports() {
        let c = Config::from_env(Preset::E2b, &env(&[("E2B_SANDBOX_URL", "http://127.0.0.1:49983")])).unwrap();
        assert_eq!(c.envd_url("abc", Some("x.y")), "http://127.0.0.1:49983");
        assert_eq!(c.port_url("abc", None, 3000), "https://3000-abc.e2b.app");
    }

    #[test]
    fn loopback_domains_use_http() {
        for d in ["localhost:8000", "localhost", "box.localhost:1", "127.0.0.1:9000", "[::1]:80"] {
            let c = Config::from_env(Preset::E2b, &env(&[("E2B_DOMAIN", d)])).unwrap();
            assert_eq!(c.port_url("abc", None, 8080), format!("http://8080-abc.{d}"), "{d}");
            assert_eq!(c.envd_url("abc", None), format!("http://49983-abc.{d}"), "{d}");
        }
        assert_eq!(scheme("localhost.example.com"), "https");
    }

    #[test]
    fn port_url_template() {
        let e = env(&[("SCENARIO_RUN_E2B_PORT_URL", "http://127.0.0.1:3000/sandboxes/{id}/ports/{port}")]);
        let c = Config::from_env(Preset::E2b, &e).unwrap();
        assert_eq!(c.port_url("abc", None, 8080), "http://127.0.0.1:3000/sandboxes/abc/ports/8080");
        let e = env(&[("SCENARIO_RUN_E2B_PORT_URL", "http://{port}-{id}.{domain}")]);
        let c = Config::from_env(Preset::E2b, &e).unwrap();
        assert_eq!(c.port_url("abc", Some("localhost:3000"), 80), "http://80-abc.localhost:3000");
        assert!(Config::from_env(Preset::E2b, &env(&[("SCENARIO_RUN_E2B_PORT_URL", "http://x")])).is_err());
    }

    #[test]
    fn create_api_override() {
        let c = Config::from_env(Preset::E2b, &env(&[("E2B_SANDBOX_CREATE_API", "v1")])).unwrap();
        assert_eq!(c.create_api, CreateApi::V1);
        let c = Config::from_env(Preset::Alicloud, &env(&[("E2B_SANDBOX_CREATE_API", "V2")])).unwrap();
        assert_eq!(c.create_api, CreateApi::V2);
        let e = Config::from_env(Preset::E2b, &env(&[("E2B_SANDBOX_CREATE_API", "v3")])).unwrap_err();
        assert!(e.message.contains("v1 or v2"));
    }

    #[test]
    fn debug_never_shows_the_key() {
        let c = Config::from_env(Preset::E2b, &env(&[("E2B_API_KEY", "e2b_supersecret")])).unwrap();
        let d = format!("{c:?}");
        assert!(!d.contains("supersecret"), "{d}");
        assert!(d.contains("<redacted>"));
    }
}
