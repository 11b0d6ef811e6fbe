//! The JSON body of a control-plane request, as one extractor for both of serve's APIs.
//!
//! Both take a JSON *object* (an empty body counts as `{}`): serde would also build a struct
//! from an array (`[]` made a sandbox of every default), which neither API accepts. They differ
//! only in how a bad body is answered, so [`JsonBody`] is generic over that ([`BadBody`]).

use std::marker::PhantomData;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Why a body is not a request.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    /// Not JSON, or not of the request's shape: serde's words.
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    #[error("the body must be a JSON object")]
    NotObject,
}

/// How an API answers a body it cannot read.
pub(crate) trait BadBody {
    fn bad_body(reason: BodyError) -> Response;
}

/// E2B's API: `{"code": 400, "message": "Error when parsing request: …"}`.
pub(crate) struct E2bApi;

impl BadBody for E2bApi {
    fn bad_body(reason: BodyError) -> Response {
        super::answer::json_error(StatusCode::BAD_REQUEST, &format!("Error when parsing request: {reason}"))
    }
}

/// OpenSandbox's lifecycle API: `SANDBOX::INVALID_PARAMETER`.
pub(crate) struct OpenSandboxApi;

impl BadBody for OpenSandboxApi {
    fn bad_body(reason: BodyError) -> Response {
        super::answer::error(
            StatusCode::BAD_REQUEST,
            "SANDBOX::INVALID_PARAMETER",
            format!("invalid request body: {reason}"),
        )
    }
}

/// A handler's request body, read as a JSON object into `T`; a body that is not one is answered
/// in `E`'s words before the handler runs.
pub(crate) struct JsonBody<T, E = E2bApi>(pub T, pub PhantomData<E>);

/// `body` as a `T`, if it is a JSON object of that shape (an empty or blank body is `{}`).
pub(crate) fn json_object<T: DeserializeOwned>(body: &[u8]) -> Result<T, BodyError> {
    let body: &[u8] = if body.iter().all(u8::is_ascii_whitespace) { b"{}" } else { body };
    let v: Value = serde_json::from_slice(body)?;
    if !v.is_object() {
        return Err(BodyError::NotObject);
    }
    Ok(serde_json::from_value(v)?)
}

impl<S, T, E> FromRequest<S> for JsonBody<T, E>
where
    S: Send + Sync,
    T: DeserializeOwned,
    E: BadBody,
{
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Response> {
        let bytes = Bytes::from_request(req, state).await.map_err(IntoResponse::into_response)?;
        json_object(&bytes).map(|t| JsonBody(t, PhantomData)).map_err(E::bad_body)
    }
}

#[cfg(test)]
mod tests {
    use super::{json_object, BodyError};
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    struct T {
        #[serde(default)]
        n: Option<u32>,
    }

    #[test]
    fn only_objects_are_bodies() {
        assert_eq!(json_object::<T>(b"").unwrap(), T { n: None });
        assert_eq!(json_object::<T>(b" \n").unwrap(), T { n: None });
        assert_eq!(json_object::<T>(br#"{"n": 3}"#).unwrap(), T { n: Some(3) });
        assert!(matches!(json_object::<T>(b"[]"), Err(BodyError::NotObject)));
        assert!(json_object::<T>(b"{").unwrap_err().to_string().contains("EOF"));
        let e = json_object::<T>(br#"{"n": "x"}"#).unwrap_err();
        assert!(matches!(&e, BodyError::Json(_)) && e.to_string().contains("invalid type"), "{e}");
    }
}
