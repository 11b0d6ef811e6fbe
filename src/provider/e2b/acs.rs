//! Alibaba Cloud OpenAPI requests signed with an AccessKey pair (signature V3,
//! `ACS3-HMAC-SHA256`), and the one call this tool makes with them: Container Registry's
//! `GetAuthorizationToken` (cr `2018-12-01`, RPC style), which turns the AccessKey pair into a
//! temporary registry login (`TempUsername`, `AuthorizationToken`, valid for an hour) for an
//! ACR Enterprise instance. `docker login` to such an instance takes that pair, not the
//! AccessKey itself.
//!
//! The signature, as Alibaba documents it
//! (<https://www.alibabacloud.com/help/en/sdk/product-overview/v3-request-structure-and-signature>):
//!
//! ```text
//! CanonicalRequest = METHOD \n CanonicalURI \n CanonicalQueryString \n
//!                    CanonicalHeaders \n SignedHeaders \n HexEncode(SHA256(body))
//! StringToSign     = "ACS3-HMAC-SHA256" \n HexEncode(SHA256(CanonicalRequest))
//! Signature        = HexEncode(HMAC-SHA256(AccessKeySecret, StringToSign))
//! Authorization: ACS3-HMAC-SHA256 Credential=<AccessKeyId>,SignedHeaders=<…>,Signature=<…>
//! ```
//!
//! Query names and values are percent-encoded as RFC 3986 says (everything but `A-Za-z0-9-_.~`,
//! space as `%20`), sorted by name, joined with `&`; the signed headers are `host`, `content-type`
//! when sent, and every `x-acs-*` header, lower-cased, sorted, as `name:value\n`.
//!
//! The secret never leaves this module except as the HMAC key; errors name the endpoint and
//! Alibaba's error code, never a credential.

use std::time::Duration;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::net::url_encode;
use crate::provider::{ErrorKind, ProviderError, Result};

pub const ALGORITHM: &str = "ACS3-HMAC-SHA256";
/// The Container Registry API version whose `GetAuthorizationToken` takes an instance id.
pub const CR_VERSION: &str = "2018-12-01";
const TIMEOUT: Duration = Duration::from_secs(30);

/// HMAC-SHA256 (RFC 2104), RustCrypto's.
pub fn hmac_sha256(key: &[u8], msg: &[u8]) -> [u8; 32] {
    use hmac::Mac as _;
    let mut mac = hmac::Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(msg);
    mac.finalize().into_bytes().into()
}

pub fn sha256_hex(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

/// One request to sign. `headers` are the `x-acs-*` (and `content-type`) headers besides
/// `host` and `x-acs-content-sha256`, which [`sign`] adds.
pub struct Request<'a> {
    pub method: &'a str,
    pub host: &'a str,
    /// The resource path, `/` for RPC-style APIs.
    pub path: &'a str,
    pub query: &'a [(&'a str, &'a str)],
    pub headers: &'a [(&'a str, &'a str)],
    pub body: &'a [u8],
}

/// What signing made: the headers to send (with `Authorization`), and the intermediate
/// strings, which the tests compare with Alibaba's worked example.
#[derive(Debug)]
pub struct Signed {
    pub headers: Vec<(String, String)>,
    pub canonical_request: String,
    pub string_to_sign: String,
    pub signature: String,
}

pub fn canonical_query(query: &[(&str, &str)]) -> String {
    let mut q: Vec<(String, String)> = query.iter().map(|(k, v)| (url_encode(k), url_encode(v))).collect();
    q.sort();
    q.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("&")
}

/// Signs `req` with the AccessKey pair.
pub fn sign(req: &Request<'_>, key_id: &str, key_secret: &str) -> Signed {
    let payload_hash = sha256_hex(req.body);
    let mut headers: Vec<(String, String)> =
        vec![("host".to_string(), req.host.to_string()), ("x-acs-content-sha256".to_string(), payload_hash.clone())];
    headers.extend(req.headers.iter().map(|(k, v)| (k.to_ascii_lowercase(), v.trim().to_string())));
    headers.sort();
    let signed_names: Vec<&str> = headers
        .iter()
        .map(|(k, _)| k.as_str())
        .filter(|k| *k == "host" || *k == "content-type" || k.starts_with("x-acs-"))
        .collect();
    let canonical_headers: String =
        headers.iter().filter(|(k, _)| signed_names.contains(&k.as_str())).map(|(k, v)| format!("{k}:{v}\n")).collect();
    let signed_headers = signed_names.join(";");
    let canonical_uri = req.path.split('/').map(url_encode).collect::<Vec<_>>().join("/");
    let canonical_request = format!(
        "{}\n{}\n{}\n{}\n{}\n{}",
        req.method,
        if canonical_uri.is_empty() { "/" } else { &canonical_uri },
        canonical_query(req.query),
        canonical_headers,
        signed_headers,
        payload_hash
    );
    let string_to_sign = format!("{ALGORITHM}\n{}", sha256_hex(canonical_request.as_bytes()));
    let signature = hex::encode(hmac_sha256(key_secret.as_bytes(), string_to_sign.as_bytes()));
    headers.push((
        "authorization".to_string(),
        format!("{ALGORITHM} Credential={key_id},SignedHeaders={signed_headers},Signature={signature}"),
    ));
    Signed { headers, canonical_request, string_to_sign, signature }
}

/// A temporary registry login from `GetAuthorizationToken`.
#[derive(Clone)]
pub struct TempLogin {
    pub username: String,
    pub password: String,
    /// Milliseconds since the epoch, as ACR answers.
    pub expires_ms: Option<i64>,
}

impl std::fmt::Debug for TempLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TempLogin").field("username", &self.username).field("password", &"***").finish()
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct TokenAnswer {
    temp_username: Option<String>,
    authorization_token: Option<String>,
    expire_time: Option<i64>,
    code: Option<String>,
    message: Option<String>,
    is_success: Option<bool>,
}

/// 32 random hex digits for `x-acs-signature-nonce`.
fn nonce() -> String {
    crate::random::hex(16)
}

/// Asks ACR (`endpoint`: `http(s)://host[:port]`) for a temporary login to `instance_id`.
pub async fn get_authorization_token(
    http: &reqwest::Client,
    endpoint: &str,
    instance_id: &str,
    key_id: &str,
    key_secret: &str,
) -> Result<TempLogin> {
    let endpoint = endpoint.trim_end_matches('/');
    let host = endpoint.split_once("://").map_or(endpoint, |(_, h)| h);
    let date = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let nonce = nonce();
    let query = [("InstanceId", instance_id)];
    let signed = sign(
        &Request {
            method: "POST",
            host,
            path: "/",
            query: &query,
            headers: &[
                ("x-acs-action", "GetAuthorizationToken"),
                ("x-acs-version", CR_VERSION),
                ("x-acs-date", &date),
                ("x-acs-signature-nonce", &nonce),
            ],
            body: b"",
        },
        key_id,
        key_secret,
    );
    let what = format!("ACR GetAuthorizationToken at {endpoint} (instance {instance_id})");
    let mut rb = http.post(format!("{endpoint}/?{}", canonical_query(&query))).timeout(TIMEOUT);
    for (k, v) in &signed.headers {
        if k != "host" {
            rb = rb.header(k.as_str(), v.as_str());
        }
    }
    let resp = rb.send().await.map_err(|e| ProviderError::infra(format!("{what}: {}", super::api::error_chain(&e))))?;
    let status = resp.status().as_u16();
    let body = resp.bytes().await.unwrap_or_default();
    let answer: Option<TokenAnswer> = serde_json::from_slice(&body).ok();
    let failed = |why: String| {
        let kind = if matches!(status, 400 | 401 | 403 | 404) { ErrorKind::Auth } else { ErrorKind::Infra };
        ProviderError::new(
            kind,
            format!("{what} failed: {why}; check ALIBABA_CLOUD_ACCESS_KEY_ID/_SECRET and SCENARIO_RUN_ACR_INSTANCE_ID"),
        )
    };
    let Some(a) = answer else {
        return Err(failed(format!("HTTP {status}, not the JSON answer expected")));
    };
    if !(200..300).contains(&status) || a.is_success == Some(false) {
        return Err(failed(format!(
            "HTTP {status} {}: {}",
            a.code.as_deref().unwrap_or("?"),
            a.message.as_deref().unwrap_or("no message")
        )));
    }
    match (a.temp_username, a.authorization_token) {
        (Some(u), Some(p)) if !u.is_empty() && !p.is_empty() => {
            Ok(TempLogin { username: u, password: p, expires_ms: a.expire_time })
        }
        _ => Err(failed(format!("HTTP {status} without TempUsername and AuthorizationToken"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 4231 test case 2 and 6 (a key longer than the block).
    #[test]
    fn hmac_sha256_matches_rfc_4231() {
        assert_eq!(
            hex::encode(hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            hex::encode(hmac_sha256(&[0xaa; 131], b"Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    /// Alibaba's worked example of signature V3: the `RunInstances` request of the V3 page
    /// (<https://www.alibabacloud.com/help/en/sdk/product-overview/v3-request-structure-and-signature>,
    /// query `ImageId=win2019_1809_x64_dtc_zh-cn_40G_alibase_20230811.vhd&RegionId=cn-shanghai`,
    /// POST to ecs.cn-shanghai.aliyuncs.com, empty body), signed with the placeholder pair
    /// `YourAccessKeyId`/`YourAccessKeySecret`, whose Authorization header
    /// <https://help.aliyun.com/zh/model-studio/roa-style-request-body-signature-mechanism>
    /// prints as `ACS3-HMAC-SHA256 Credential=YourAccessKeyId,SignedHeaders=host;x-acs-action;
    /// x-acs-content-sha256;x-acs-date;x-acs-signature-nonce;x-acs-version,Signature=e521358f…`
    /// with `x-acs-date: 2023-10-26T09:01:01Z`, `x-acs-signature-nonce:
    /// d410180a5abf7fe235dd9b74aca91fc0`, `x-acs-version: 2014-05-26` and
    /// `x-acs-content-sha256: e3b0c442…b855`.
    #[test]
    fn v3_signature_matches_alibabas_worked_example() {
        let s = sign(
            &Request {
                method: "POST",
                host: "ecs.cn-shanghai.aliyuncs.com",
                path: "/",
                query: &[
                    ("RegionId", "cn-shanghai"),
                    ("ImageId", "win2019_1809_x64_dtc_zh-cn_40G_alibase_20230811.vhd"),
                ],
                headers: &[
                    ("x-acs-action", "RunInstances"),
                    ("x-acs-version", "2014-05-26"),
                    ("x-acs-date", "2023-10-26T09:01:01Z"),
                    ("x-acs-signature-nonce", "d410180a5abf7fe235dd9b74aca91fc0"),
                ],
                body: b"",
            },
            "YourAccessKeyId",
            "YourAccessKeySecret",
        );
        let header = |n: &str| s.headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str()).unwrap();
        assert_eq!(header("x-acs-content-sha256"), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        assert_eq!(
            s.canonical_request,
            "POST\n/\nImageId=win2019_1809_x64_dtc_zh-cn_40G_alibase_20230811.vhd&RegionId=cn-shanghai\n\
             host:ecs.cn-shanghai.aliyuncs.com\nx-acs-action:RunInstances\n\
             x-acs-content-sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n\
             x-acs-date:2023-10-26T09:01:01Z\nx-acs-signature-nonce:d410180a5abf7fe235dd9b74aca91fc0\n\
             x-acs-version:2014-05-26\n\n\
             host;x-acs-action;x-acs-content-sha256;x-acs-date;x-acs-signature-nonce;x-acs-version\n\
             e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            header("authorization"),
            "ACS3-HMAC-SHA256 Credential=YourAccessKeyId,SignedHeaders=host;x-acs-action;x-acs-content-sha256;\
             x-acs-date;x-acs-signature-nonce;x-acs-version,\
             Signature=e521358f7776c97df52e6b2891a8bc73026794a071b50c3323388c4e0df64804"
        );
        // Another secret, another signature: the secret is the key.
        let other = sign(
            &Request {
                method: "POST",
                host: "ecs.cn-shanghai.aliyuncs.com",
                path: "/",
                query: &[],
                headers: &[],
                body: b"",
            },
            "YourAccessKeyId",
            "another",
        );
        assert_ne!(other.signature, s.signature);
    }

    /// The encoding rule of the signature pages: unreserved characters stay, space is `%20`
    /// (not `+`), `*` is `%2A`, `~` stays, UTF-8 bytes each get `%XY`.
    #[test]
    fn percent_encoding_follows_rfc_3986() {
        assert_eq!(url_encode("a b*c~d-e_f.g/h:é"), "a%20b%2Ac~d-e_f.g%2Fh%3A%C3%A9");
        assert_eq!(canonical_query(&[("b", "2"), ("a", "x y"), ("A", "")]), "A=&a=x%20y&b=2");
    }
}
