//! The OpenAPI document of the Try API (`/openapi.json`): what utoipa derives from the
//! handlers, plus what the derive cannot state (a SCHEDULED Try's processing time, links in
//! camel case, the bearer security scheme and its 401/403 answers).

use crate::{
    ErrorBody, ItemOutcome, OrderItemBody, OrderReservations, OrderTryBody, OrderTryResponse,
    OrderTypeDto, StockNumbersDto, StockResponse, TryBody, TryResponse,
};
use serde_json::{json, Value};
use stocksvr_reservation::view::ReservationView;
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "stocksvr Try API",
        description = "Reserve dish stock for orders; read reservations and stock."
    ),
    paths(
        crate::try_reservation,
        crate::try_order,
        crate::get_reservation,
        crate::list_order_reservations,
        crate::get_stock
    ),
    components(schemas(
        TryBody,
        OrderTryBody,
        OrderItemBody,
        OrderTypeDto,
        TryResponse,
        OrderTryResponse,
        ItemOutcome,
        OrderReservations,
        ReservationView,
        StockResponse,
        StockNumbersDto,
        ErrorBody
    ))
)]
pub struct ApiDoc;

/// The document served at `/openapi.json`.
pub fn openapi_json() -> Value {
    let mut doc = match serde_json::to_value(ApiDoc::openapi()) {
        Ok(doc) => doc,
        // Plain structs and maps: serializing cannot fail, but a handler must not panic.
        Err(e) => return json!({ "error": e.to_string() }),
    };
    require_scheduled_time(&mut doc);
    for op in operations(&mut doc) {
        rename_links(op);
        declare_refusals(op);
    }
    declare_bearer(&mut doc);
    doc
}

/// Every operation object of the document.
fn operations(doc: &mut Value) -> impl Iterator<Item = &mut serde_json::Map<String, Value>> {
    doc["paths"]
        .as_object_mut()
        .into_iter()
        .flat_map(|paths| paths.values_mut())
        .filter_map(|path| path.as_object_mut())
        .flat_map(|methods| methods.values_mut())
        .filter_map(|op| op.as_object_mut())
}

/// What the derive cannot state: a SCHEDULED Try needs its processing time, and an order
/// lists each line once.
fn require_scheduled_time(doc: &mut Value) {
    let scheduled_needs_time = json!({
        "if": {"properties": {"order_type": {"const": "SCHEDULED"}}, "required": ["order_type"]},
        "then": {"required": ["processing_time"],
                 "properties": {"processing_time": {"type": "string", "format": "date-time"}}}
    });
    let Some(schemas) = doc
        .pointer_mut("/components/schemas")
        .and_then(|s| s.as_object_mut())
    else {
        return;
    };
    for name in ["TryBody", "OrderTryBody"] {
        if let (Some(schema), Some(rule)) = (
            schemas.get_mut(name).and_then(|s| s.as_object_mut()),
            scheduled_needs_time.as_object(),
        ) {
            schema.extend(rule.clone());
        }
    }
    if let Some(items) = schemas
        .get_mut("OrderTryBody")
        .and_then(|s| s.pointer_mut("/properties/items"))
        .and_then(|s| s.as_object_mut())
    {
        items.insert("uniqueItems".into(), Value::Bool(true));
    }
}

/// utoipa 5.5 serializes a response link's fields in snake case (`operation_id`,
/// `operation_ref`, `request_body`), which no OpenAPI tool reads: a link without
/// `operationId` is invalid and schemathesis refused the whole document for it. The links
/// are renamed here until utoipa does it itself.
fn rename_links(op: &mut serde_json::Map<String, Value>) {
    let responses = op
        .get_mut("responses")
        .and_then(|r| r.as_object_mut())
        .into_iter()
        .flat_map(|responses| responses.values_mut());
    for response in responses {
        let links = response.get_mut("links").and_then(|l| l.as_object_mut());
        for link in links.into_iter().flat_map(|l| l.values_mut()) {
            if let Some(link) = link.as_object_mut() {
                for (snake, camel) in [
                    ("operation_id", "operationId"),
                    ("operation_ref", "operationRef"),
                    ("request_body", "requestBody"),
                ] {
                    if let Some(v) = link.remove(snake) {
                        link.insert(camel.to_string(), v);
                    }
                }
            }
        }
    }
}

/// The answers of the caller check in front of every operation (`stocksvr_api::auth`).
fn declare_refusals(op: &mut serde_json::Map<String, Value>) {
    let Some(responses) = op.get_mut("responses").and_then(|r| r.as_object_mut()) else {
        return;
    };
    let body = json!({"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}});
    responses.insert(
        "401".into(),
        json!({"description": "No bearer token, a malformed one, or one no client has (unknown or revoked); nothing ran", "content": body}),
    );
    responses.insert(
        "403".into(),
        json!({"description": "The client lacks the api scope; nothing ran", "content": body}),
    );
}

/// Bearer tokens per client (or a client certificate of an allowed subject: mutual TLS).
/// Required when the service configures callers (`http.auth`); a loopback listener without
/// them serves every caller.
fn declare_bearer(doc: &mut Value) {
    if let Some(components) = doc.get_mut("components").and_then(|c| c.as_object_mut()) {
        components.insert(
            "securitySchemes".into(),
            json!({
                "bearer": {"type": "http", "scheme": "bearer",
                    "description": "A client's token (http.auth.clients, stored there as its SHA-256)"},
                "mutualTLS": {"type": "mutualTLS",
                    "description": "A client certificate from http.tls.client_ca_file whose CN or DNS name is an allowed subject"}
            }),
        );
    }
    if let Some(doc) = doc.as_object_mut() {
        doc.insert(
            "security".into(),
            json!([{"bearer": []}, {"mutualTLS": []}]),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn document() -> Value {
        openapi_json()
    }

    /// Every link names an operation of the document (schemathesis' stateful phase follows
    /// them: a Try's reservation id into the reads).
    #[test]
    fn every_link_targets_an_operation_of_the_document() {
        let doc = document();
        let paths = doc["paths"].as_object().expect("paths");
        let operations: BTreeSet<&str> = paths
            .values()
            .flat_map(|p| p.as_object().into_iter().flat_map(|m| m.values()))
            .filter_map(|op| op["operationId"].as_str())
            .collect();
        let mut links = 0;
        for op in paths
            .values()
            .flat_map(|p| p.as_object().expect("methods").values())
        {
            for response in op["responses"].as_object().expect("responses").values() {
                for link in response["links"]
                    .as_object()
                    .into_iter()
                    .flat_map(|l| l.values())
                {
                    let target = link["operationId"].as_str().expect("operationId");
                    assert!(operations.contains(target), "link to unknown {target}");
                    links += 1;
                }
            }
        }
        assert!(links >= 5, "{links} links");
    }

    /// The caller check answers before any operation: each documents its 401 and 403, and
    /// the document names the bearer scheme schemathesis authenticates with.
    #[test]
    fn every_operation_documents_the_caller_check() {
        let doc = document();
        assert_eq!(
            doc["components"]["securitySchemes"]["bearer"]["scheme"],
            "bearer"
        );
        assert_eq!(doc["security"][0], json!({"bearer": []}));
        let mut operations = 0;
        for op in doc["paths"]
            .as_object()
            .expect("paths")
            .values()
            .flat_map(|p| p.as_object().expect("methods").values())
        {
            for status in ["401", "403"] {
                let schema = &op["responses"][status]["content"]["application/json"]["schema"];
                assert_eq!(schema["$ref"], "#/components/schemas/ErrorBody", "{op}");
            }
            operations += 1;
        }
        assert_eq!(operations, 5);
    }

    /// Ids are Avro longs: the document bounds them as the handlers do.
    #[test]
    fn ids_are_bounded_like_an_avro_long() {
        let doc = document();
        let body = &doc["components"]["schemas"]["TryBody"]["properties"]["order_id"];
        assert_eq!(body["minimum"], 1, "{body}");
        assert_eq!(body["maximum"].as_u64(), Some(i64::MAX as u64), "{body}");
        let id = &doc["paths"]["/v1/reservations/{id}"]["get"]["parameters"][0]["schema"];
        assert_eq!(id["maximum"].as_u64(), Some(i64::MAX as u64), "{id}");
        if let Ok(file) = std::env::var("STOCKSVR_DUMP_OPENAPI") {
            std::fs::write(file, serde_json::to_string_pretty(&doc).expect("json")).expect("dump");
        }
    }
}
