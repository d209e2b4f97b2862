//! Every error leaves as JSON naming what was wrong: `{"error", "field"?, "message"}`.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use stocksvr_reservation::ServiceError;

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// Stable machine-readable code, e.g. `invalid_request`, `bucket_not_found`.
    pub error: &'static str,
    /// The request field at fault, when one is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    pub message: String,
}

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub body: ErrorBody,
}

impl ApiError {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            body: ErrorBody {
                error: "invalid_request",
                field: Some(field.into()),
                message: message.into(),
            },
        }
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            body: ErrorBody {
                error: "unavailable",
                field: None,
                message: message.into(),
            },
        }
    }

    pub fn conflict(error: &'static str, field: Option<&str>, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::CONFLICT,
            body: ErrorBody {
                error,
                field: field.map(str::to_string),
                message: message.into(),
            },
        }
    }

    pub fn not_found(error: &'static str, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            body: ErrorBody {
                error,
                field: None,
                message: message.into(),
            },
        }
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> Self {
        let message = e.to_string();
        let (status, error, field) = match &e {
            ServiceError::Invalid { field, .. } => (
                StatusCode::BAD_REQUEST,
                "invalid_request",
                Some(field.to_string()),
            ),
            ServiceError::NotFound(_) => (StatusCode::NOT_FOUND, "reservation_not_found", None),
            ServiceError::BucketNotFound(_) => (StatusCode::NOT_FOUND, "bucket_not_found", None),
            ServiceError::BucketUnavailable { .. } => {
                (StatusCode::CONFLICT, "bucket_unavailable", None)
            }
            ServiceError::OverRefund { .. } => {
                (StatusCode::CONFLICT, "over_refund", Some("quantity".into()))
            }
            // Fail closed: never sell without a definite answer from Redis.
            ServiceError::OutcomeUnknown { .. } => {
                (StatusCode::SERVICE_UNAVAILABLE, "redis_unavailable", None)
            }
            ServiceError::Mysql(_) => (StatusCode::SERVICE_UNAVAILABLE, "mysql_unavailable", None),
            // Fail closed until the bucket is rebuilt from MySQL; nothing was written.
            ServiceError::BucketLost { .. } => {
                (StatusCode::SERVICE_UNAVAILABLE, "bucket_lost", None)
            }
            ServiceError::Inconsistent { .. } => {
                (StatusCode::INTERNAL_SERVER_ERROR, "inconsistent", None)
            }
        };
        if status.is_server_error() {
            tracing::warn!(error = %message, "request failed");
        }
        Self {
            status,
            body: ErrorBody {
                error,
                field,
                message,
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let lost = self.body.error == "bucket_lost";
        let mut response = (self.status, Json(self.body)).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            // The Try is idempotent: repeating it resumes the same reservation. A lost
            // bucket comes back after an operator's rebuild, not within a second.
            let after = if lost { "30" } else { "1" };
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static(after));
        }
        response
    }
}

/// Parses a JSON body, naming the offending field on failure.
pub fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let at_root = path == "." || path.is_empty();
        // A missing field is reported at its parent; serde names it in the message.
        let field = match (missing_field(&inner.to_string()), at_root) {
            (Some(name), true) => name,
            (Some(name), false) => format!("{path}.{name}"),
            (None, true) => "body".to_string(),
            (None, false) => path,
        };
        ApiError::invalid(field, inner.to_string())
    })
}

fn missing_field(message: &str) -> Option<String> {
    let rest = message.strip_prefix("missing field `")?;
    Some(rest.split('`').next()?.to_string())
}
