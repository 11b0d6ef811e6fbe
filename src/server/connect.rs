//! The Connect protocol as envd speaks it to the SDK: JSON codec only (protocol doc §4.1).
//!
//! * Unary calls: the request body is the bare JSON message; success is 200
//!   `application/json`; failure is a non-200 status (the Connect HTTP mapping) with
//!   `{"code":"not_found","message":"…"}`.
//! * Server-streaming calls: the request is one envelope (flag byte, 4-byte big-endian length,
//!   JSON), or a raw JSON body from old clients; the response is 200
//!   `application/connect+json`, message envelopes (flag 0) and one end-stream envelope (flag
//!   `0x02`) holding `{}` or `{"error":{…}}`. Handler errors on streams are reported in the
//!   end-stream envelope, never as an HTTP status.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use crate::provider::ProviderError;

pub(crate) const CONNECT_JSON: &str = "application/connect+json";

/// A Connect error: a code name (`not_found`, `invalid_argument`, …) and a message.
#[derive(Debug, Clone)]
pub(crate) struct RpcError {
    pub code: &'static str,
    pub message: String,
}

impl RpcError {
    pub(crate) fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new("invalid_argument", message)
    }
    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new("not_found", message)
    }
    pub(crate) fn unimplemented(message: impl Into<String>) -> Self {
        Self::new("unimplemented", message)
    }

    /// The HTTP status of a unary error with this code (Connect's mapping).
    pub(crate) fn status(&self) -> StatusCode {
        StatusCode::from_u16(crate::connect::http_status(self.code)).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    pub(crate) fn to_json(&self) -> Value {
        json!({"code": self.code, "message": super::scrub::answer(self.status().as_u16(), &self.message)})
    }
}

impl From<ProviderError> for RpcError {
    fn from(e: ProviderError) -> Self {
        Self::new(crate::connect::code_of(e.kind), e.message)
    }
}

impl IntoResponse for RpcError {
    /// The unary error response.
    fn into_response(self) -> Response {
        let mut body = self.to_json();
        body["details"] = json!([]);
        (self.status(), [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], body.to_string())
            .into_response()
    }
}

/// A successful unary response.
pub(crate) fn unary_ok(v: Value) -> Response {
    ([(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], v.to_string()).into_response()
}

/// The result of a unary handler.
pub(crate) type Unary = Result<Value, RpcError>;

/// Turns a unary handler's result into its response.
pub(crate) fn unary(r: Unary) -> Response {
    match r {
        Ok(v) => unary_ok(v),
        Err(e) => e.into_response(),
    }
}

/// One envelope: flags, 4-byte big-endian length, payload.
pub(crate) fn envelope(flags: u8, payload: &[u8]) -> Bytes {
    Bytes::from(crate::connect::envelope(flags, payload))
}

/// A message envelope holding `v`.
pub(crate) fn message(v: &Value) -> Bytes {
    envelope(0, v.to_string().as_bytes())
}

/// The end-stream envelope: `{}` or `{"error":{…}}`.
pub(crate) fn end_stream(err: Option<&RpcError>) -> Bytes {
    let v = match err {
        None => json!({}),
        Some(e) => json!({"error": e.to_json()}),
    };
    envelope(crate::connect::FLAG_END_STREAM, v.to_string().as_bytes())
}

/// The single request message of a streaming call: an envelope, or raw JSON from old clients.
pub(crate) fn stream_request<T: DeserializeOwned>(body: &[u8]) -> Result<T, RpcError> {
    let payload = match body.first() {
        Some(b'{') => body,
        Some(&flags) => {
            if body.len() < 5 {
                return Err(RpcError::invalid("truncated envelope"));
            }
            if flags & crate::connect::FLAG_COMPRESSED != 0 {
                return Err(RpcError::unimplemented("compressed messages are not supported"));
            }
            let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
            body.get(5..5 + len).ok_or_else(|| RpcError::invalid("truncated envelope"))?
        }
        None => b"{}".as_slice(),
    };
    parse(payload)
}

/// A unary request message (an empty body is the empty message).
pub(crate) fn unary_request<T: DeserializeOwned>(body: &[u8]) -> Result<T, RpcError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return parse(b"{}");
    }
    parse(body)
}

fn parse<T: DeserializeOwned>(payload: &[u8]) -> Result<T, RpcError> {
    serde_json::from_slice(payload).map_err(|e| RpcError::invalid(format!("invalid request message: {e}")))
}

/// Proto3 JSON accepts integers as numbers or strings; this reads either.
pub(crate) mod lenient {
    use serde::{Deserialize, Deserializer};
    use serde_json::Value;

    pub(crate) fn opt_u32<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
        let v = Option::<Value>::deserialize(d)?;
        Ok(match v {
            Some(Value::Number(n)) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
            Some(Value::String(s)) => s.parse().ok(),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_roundtrip() {
        let e = message(&json!({"a": 1}));
        assert_eq!(&e[..5], &[0, 0, 0, 0, 7]);
        let v: Value = stream_request(&e).unwrap();
        assert_eq!(v, json!({"a": 1}));
        let raw: Value = stream_request(b"{\"b\":2}").unwrap();
        assert_eq!(raw, json!({"b": 2}));
        assert_eq!(&end_stream(None)[..], b"\x02\x00\x00\x00\x02{}");
        assert!(stream_request::<Value>(&[1, 0, 0, 0, 2, b'{', b'}']).is_err());
    }

    #[test]
    fn codes_map_to_http_statuses() {
        assert_eq!(RpcError::not_found("x").status(), 404);
        assert_eq!(RpcError::new("already_exists", "x").status(), 409);
        assert_eq!(RpcError::new("deadline_exceeded", "x").status(), 504);
        assert_eq!(RpcError::from(ProviderError::invalid("x")).code, "invalid_argument");
    }
}
