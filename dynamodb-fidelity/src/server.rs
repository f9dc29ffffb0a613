//! The listener: HTTP/1.1 connections on loopback, each request routed to the control
//! endpoints (`/_fidelity/…`) or to DynamoDB's API.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use crate::proxy::Proxy;
use crate::{control, ops, reply};

/// Serves `listener` until dropped (aborted): dropping the connections' set aborts them.
pub(crate) async fn serve(listener: TcpListener, proxy: Arc<Proxy>) {
    let mut connections = JoinSet::new();
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                // Out of file descriptors, say: wait for some to close.
                tracing::warn!(%error, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        while connections.try_join_next().is_some() {}
        // Small requests and answers: never wait to fill a segment.
        let _ = stream.set_nodelay(true);
        let proxy = proxy.clone();
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let proxy = proxy.clone();
                async move { Ok::<_, Infallible>(route(proxy, request).await) }
            });
            if let Err(error) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%error, "a client connection ended in error");
            }
        });
    }
}

async fn route(proxy: Arc<Proxy>, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let (parts, body) = request.into_parts();
    let body = match body.collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => {
            return reply::json(
                StatusCode::BAD_REQUEST,
                &json!({"message": "the request body could not be read"}),
            );
        }
    };
    if parts.uri.path().starts_with(control::PREFIX) {
        return control::answer(&proxy, &parts, &body);
    }
    // A task of its own: once forwarded, a write is billed even if its client goes away.
    // The added latency, half on the way there and half on the way back.
    let answered = tokio::spawn(async move {
        let delay = proxy.delay();
        if !delay.is_zero() {
            tokio::time::sleep(delay / 2).await;
        }
        let response = ops::answer(&proxy, parts, body).await;
        if !delay.is_zero() {
            tokio::time::sleep(delay - delay / 2).await;
        }
        response
    });
    match answered.await {
        Ok(response) => response,
        Err(error) => {
            tracing::error!(%error, "answering a request failed");
            reply::json(
                StatusCode::INTERNAL_SERVER_ERROR,
                &json!({"message": "the proxy failed to answer"}),
            )
        }
    }
}
