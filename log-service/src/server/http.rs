//! The HTTP/JSON routes for tools: health, stats, segments, and append,
//! read, tail and trim of a log. Errors are JSON `{"error": "..."}` with
//! the status that fits; a bearer token's rights apply as on the binary
//! protocol.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Bytes as AxBytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response as HttpResponse};
use axum::Json;
use bytes::Bytes;
use serde_json::json;

use super::context::{allowed, Ctx};
use crate::config::Rights;
use crate::error::StoreError;
use crate::protocol::Request;

/// An error answer: `status` with the JSON body `{"error": msg}`.
pub(super) fn http_error(status: StatusCode, msg: impl Into<String>) -> HttpResponse {
    (status, Json(json!({ "error": msg.into() }))).into_response()
}

/// A store error as the HTTP status that fits it, with its message.
fn store_http_error(e: &StoreError) -> HttpResponse {
    let status = match e {
        StoreError::BadLogName(_) | StoreError::TrimBeyondTail { .. } => StatusCode::BAD_REQUEST,
        StoreError::NotYetWritten { .. } => StatusCode::NOT_FOUND,
        StoreError::Trimmed { .. } => StatusCode::GONE,
        StoreError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        StoreError::Full(_) | StoreError::NoSpace(_) | StoreError::Exhausted(_) => {
            StatusCode::INSUFFICIENT_STORAGE
        }
        StoreError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
        StoreError::WriteFailed(_) | StoreError::Unrecoverable { .. } => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
    };
    http_error(status, e.to_string())
}

/// The rights of the request's bearer token (every right when the
/// service has no tokens); 401 without a known one.
pub(super) fn http_rights(ctx: &Ctx, headers: &HeaderMap) -> Result<Rights, Box<HttpResponse>> {
    if let Some(r) = ctx.open_rights() {
        return Ok(r);
    }
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match token.and_then(|t| ctx.rights_for(t)) {
        Some(r) => Ok(r),
        None => {
            ctx.metrics.auth_failures.fetch_add(1, Ordering::Relaxed);
            Err(Box::new(http_error(
                StatusCode::UNAUTHORIZED,
                "send Authorization: Bearer <token>",
            )))
        }
    }
}

/// Counts an HTTP API request and checks its token may do `req`:
/// 401 without a known token, 403 without the right.
fn check(ctx: &Ctx, headers: &HeaderMap, req: &Request) -> Result<(), Box<HttpResponse>> {
    ctx.metrics.http_requests.fetch_add(1, Ordering::Relaxed);
    let r = http_rights(ctx, headers)?;
    allowed(&r, req).map_err(|why| Box::new(http_error(StatusCode::FORBIDDEN, why)))
}

/// `GET /health`: 200 while appends are taken, 503 with the reason while
/// they are refused (reads still work).
pub(super) async fn health(State(ctx): State<Arc<Ctx>>) -> HttpResponse {
    let s = ctx.store.stats();
    match ctx.store.appends_refused() {
        None => Json(json!({ "status": "ok", "logs": s.logs.len(), "segments": s.segments }))
            .into_response(),
        // Reads still work; a probe that routes appends here must not.
        Some(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({
                "status": "refusing_appends",
                "reason": why,
                "logs": s.logs.len(),
                "segments": s.segments
            })),
        )
            .into_response(),
    }
}

/// `GET /v1/stats`: the store's counters and the last recovery's report.
pub(super) async fn stats(State(ctx): State<Arc<Ctx>>, headers: HeaderMap) -> HttpResponse {
    if let Err(r) = http_rights(&ctx, &headers) {
        return *r;
    }
    Json(json!({ "store": ctx.store.stats(), "recovery": ctx.store.recovery() })).into_response()
}

/// `GET /v1/segments`: every segment file and its state.
pub(super) async fn segments(State(ctx): State<Arc<Ctx>>, headers: HeaderMap) -> HttpResponse {
    if let Err(r) = http_rights(&ctx, &headers) {
        return *r;
    }
    Json(ctx.store.segments().await).into_response()
}

/// A header's value as a number; 0 when absent or not a number.
fn header_u64(headers: &HeaderMap, name: &str) -> u64 {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// `POST /v1/logs/{log}/append`: the body is one record (at most
/// `max_record_bytes`, 413 beyond), with optional `x-client-id` and
/// `x-request-id` headers for an idempotent retry; answers its position.
pub(super) async fn http_append(
    State(ctx): State<Arc<Ctx>>,
    Path(log): Path<String>,
    headers: HeaderMap,
    body: Result<AxBytes, BytesRejection>,
) -> HttpResponse {
    let client = header_u64(&headers, "x-client-id");
    let request = header_u64(&headers, "x-request-id");
    let req = Request::Append {
        log: log.clone(),
        client,
        request,
        bytes: AxBytes::new(),
    };
    // Rights first: a caller without them learns that, not the size rule.
    if let Err(r) = check(&ctx, &headers, &req) {
        return *r;
    }
    let body = match body {
        Ok(b) => b,
        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            let limit = ctx.store.config().max_record_bytes;
            return http_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "record exceeds max_record_bytes {limit}; it was not appended; \
                     split it or raise the limit"
                ),
            );
        }
        Err(e) => return http_error(e.status(), e.body_text()),
    };
    match ctx.store.append(&log, client, request, body).await {
        Ok(pos) => Json(json!({ "pos": pos })).into_response(),
        Err(e) => store_http_error(&e),
    }
}

/// `GET /v1/logs/{log}/entries/{pos}`: the record's bytes.
pub(super) async fn http_read(
    State(ctx): State<Arc<Ctx>>,
    Path((log, pos)): Path<(String, u64)>,
    headers: HeaderMap,
) -> HttpResponse {
    if let Err(r) = check(
        &ctx,
        &headers,
        &Request::Read {
            log: log.clone(),
            pos,
        },
    ) {
        return *r;
    }
    match ctx.store.read(&log, pos) {
        Ok(e) => (
            [("content-type", "application/octet-stream")],
            Bytes::from_owner(e),
        )
            .into_response(),
        Err(e) => store_http_error(&e),
    }
}

/// `GET /v1/logs/{log}/tail`: the log's first position and its tail.
pub(super) async fn http_tail(
    State(ctx): State<Arc<Ctx>>,
    Path(log): Path<String>,
    headers: HeaderMap,
) -> HttpResponse {
    if let Err(r) = check(&ctx, &headers, &Request::Bounds { log: log.clone() }) {
        return *r;
    }
    if let Err(e) = crate::store::check_log_name(&log) {
        return store_http_error(&e);
    }
    let (first, tail) = ctx.store.bounds(&log);
    Json(json!({ "first": first, "tail": tail })).into_response()
}

/// `POST /v1/logs/{log}/trim/{pos}`: drops the positions below `pos`.
pub(super) async fn http_trim(
    State(ctx): State<Arc<Ctx>>,
    Path((log, pos)): Path<(String, u64)>,
    headers: HeaderMap,
) -> HttpResponse {
    if let Err(r) = check(
        &ctx,
        &headers,
        &Request::Trim {
            log: log.clone(),
            pos,
        },
    ) {
        return *r;
    }
    match ctx.store.trim(&log, pos).await {
        Ok(()) => Json(json!({ "first": pos })).into_response(),
        Err(e) => store_http_error(&e),
    }
}
