//! A minimal HTTP/1.0 client for counterd's own endpoints (`/metrics`, `/healthz`, `/readyz`),
//! shared by the integration tests' daemon harness and the benchmark's soak: enough to read a
//! status code and a body on 127.0.0.1, with nothing to configure.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `GET path` on `127.0.0.1:port`: the status code and the body, or `None` when nothing
/// answered within 3 s (a daemon not listening yet, or gone).
pub async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let fut = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
            .await
            .ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        let code = text.split_whitespace().nth(1)?.parse().ok()?;
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        Some((code, body))
    };
    tokio::time::timeout(Duration::from_secs(3), fut)
        .await
        .ok()
        .flatten()
}
