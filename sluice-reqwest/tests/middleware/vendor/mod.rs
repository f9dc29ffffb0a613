//! A fake vendor on loopback: answers every host it is reached under, with replies scripted
//! per path, and records what it served.

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

/// What the vendor answers on one path.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub delay: Duration,
}

impl Reply {
    pub fn status(status: u16) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            delay: Duration::ZERO,
        }
    }

    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Reply {
        self.headers.push((name, value.into()));
        self
    }

    pub fn delay(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }
}

/// The fake vendor.
#[derive(Clone)]
pub struct Vendor {
    pub addr: SocketAddr,
    replies: Arc<Mutex<HashMap<String, Reply>>>,
    served: Arc<Mutex<Vec<(String, String)>>>,
}

impl Vendor {
    pub async fn start() -> Vendor {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let vendor = Vendor {
            addr: listener.local_addr().unwrap(),
            replies: Arc::default(),
            served: Arc::default(),
        };
        let server = vendor.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let server = server.clone();
                tokio::spawn(async move {
                    let service =
                        hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                            let server = server.clone();
                            async move { Ok::<_, Infallible>(server.answer(req).await) }
                        });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        vendor
    }

    async fn answer(&self, req: hyper::Request<Incoming>) -> hyper::Response<Full<Bytes>> {
        let host = req
            .headers()
            .get(hyper::header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default()
            .split(':')
            .next()
            .unwrap_or_default()
            .to_owned();
        let path = req.uri().path().to_owned();
        self.served.lock().unwrap().push((host, path.clone()));
        let reply = self
            .replies
            .lock()
            .unwrap()
            .get(&path)
            .cloned()
            .unwrap_or_else(|| Reply::status(200));
        if !reply.delay.is_zero() {
            tokio::time::sleep(reply.delay).await;
        }
        let mut response = hyper::Response::new(Full::new(Bytes::from_static(b"{}")));
        *response.status_mut() = hyper::StatusCode::from_u16(reply.status).unwrap();
        for (name, value) in reply.headers {
            response.headers_mut().insert(name, value.parse().unwrap());
        }
        response
    }

    /// Scripts the reply on `path`.
    pub fn reply(&self, path: &str, reply: Reply) {
        self.replies.lock().unwrap().insert(path.to_owned(), reply);
    }

    /// How many requests reached `host`.
    pub fn served(&self, host: &str) -> usize {
        self.served
            .lock()
            .unwrap()
            .iter()
            .filter(|(h, _)| h == host)
            .count()
    }

    /// A reqwest client that reaches this vendor under every given host name.
    pub fn reqwest(&self, hosts: &[&str]) -> reqwest::Client {
        hosts
            .iter()
            .fold(reqwest::Client::builder(), |b, host| {
                b.resolve(host, self.addr)
            })
            .build()
            .unwrap()
    }

    /// `http://{host}:{port}{path}`.
    pub fn url(&self, host: &str, path: &str) -> String {
        format!("http://{host}:{}{path}", self.addr.port())
    }
}
