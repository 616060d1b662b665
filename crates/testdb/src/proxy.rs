//! A fault proxy: a TCP proxy between counterd and the test server that the tests steer, so
//! that the network faults a production sidecar meets (a connection reset mid-batch, a reply
//! lost after the server applied the request, a slow link, a server that holds every reply for
//! seconds) can be produced on purpose, at a chosen step, and asserted on.
//!
//! It speaks just enough of MongoDB's wire protocol to frame messages (a 16-byte header whose
//! first field is the message length) and to read a request's command name: in an `OP_MSG` the
//! body's first BSON key is the command (`update`, `getMore`, `createIndexes`), in a legacy
//! `OP_QUERY` (the driver's first handshake) the query's first key is. So a fault can hit "the
//! next `createIndexes`", or, with [`Target::containing`], "the next `update` of
//! `counterd_dirty`" (the collection name is in the request's bytes).
//!
//! Faults:
//! - [`FaultProxy::drop_replies`]: forward the request, then swallow its reply and close the
//!   client's connection (the server applied it; the client never hears, as after a network
//!   partition or a primary's crash right after a write);
//! - [`FaultProxy::reset_requests`]: close the connection instead of forwarding the request
//!   (the server never sees it);
//! - [`FaultProxy::refuse`]: answer the request with a command error (`{ok: 0, code}`) in the
//!   server's place, as a server that refuses it for good would (bad credentials, no right);
//! - [`FaultProxy::reset_all`]: close every open connection now;
//! - [`FaultProxy::set_latency`]: delay every request;
//! - [`FaultProxy::stall`]: hold all traffic, both ways, for a while (a paused server or a
//!   partition that heals), new connections included.
//!
//! Closing is abortive (an RST, as a dropped link or a killed peer is seen), and counted in
//! [`FaultStats`], so a test waits for a fault to have fired before asserting its effect.
//!
//! The proxy runs on its own thread and runtime: it keeps forwarding while a test's runtime is
//! busy or blocked, and stops when the [`FaultProxy`] is dropped.

use std::collections::HashSet;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Which requests a fault hits.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Target {
    /// The command name (`update`, `getMore`, `isMaster`); `None`: any request.
    pub command: Option<String>,
    /// Bytes the request must contain (a collection name, a field); `None`: any.
    pub containing: Option<String>,
}

impl Target {
    /// Every request.
    pub fn any() -> Target {
        Target::default()
    }

    /// Requests of this command (`update`, `find`, `getMore`, `createIndexes`, ...).
    pub fn command(name: &str) -> Target {
        Target {
            command: Some(name.to_string()),
            containing: None,
        }
    }

    /// Only requests whose bytes contain `text` (e.g. the collection `counterd_dirty`).
    pub fn containing(mut self, text: &str) -> Target {
        self.containing = Some(text.to_string());
        self
    }

    fn matches(&self, message: &[u8]) -> bool {
        if let Some(command) = &self.command {
            if command_name(message).as_deref() != Some(command.as_str()) {
                return false;
            }
        }
        match &self.containing {
            Some(text) => contains(message, text.as_bytes()),
            None => true,
        }
    }
}

/// What the proxy did so far: each fault counted when it fired.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Client connections accepted.
    pub connections: u64,
    /// Replies swallowed after their request was forwarded (each closed its connection).
    pub dropped_replies: u64,
    /// Requests not forwarded: their connection was closed instead.
    pub reset_requests: u64,
    /// Connections closed by [`FaultProxy::reset_all`].
    pub reset_connections: u64,
    /// Requests forwarded.
    pub requests: u64,
    /// Requests answered with an error in the server's place.
    pub refused: u64,
}

/// A fault that waits for its requests.
#[derive(Clone, Debug)]
struct Armed {
    target: Target,
    left: u64,
}

#[derive(Default)]
struct Counters {
    connections: AtomicU64,
    dropped_replies: AtomicU64,
    reset_requests: AtomicU64,
    reset_connections: AtomicU64,
    requests: AtomicU64,
    refused: AtomicU64,
}

/// The proxy's state, shared by its connections and steered by the [`FaultProxy`].
struct Shared {
    drop_replies: Mutex<Vec<Armed>>,
    reset_requests: Mutex<Vec<Armed>>,
    /// Refusals: the target, and the error (code, message) to answer with.
    refusals: Mutex<Vec<(Armed, i32, String)>>,
    latency: Mutex<Duration>,
    /// The end of the stall on now (`None`: none); a watch, so that ending a stall early
    /// releases the traffic it holds at once.
    stalled_until: watch::Sender<Option<Instant>>,
    counters: Counters,
}

impl Default for Shared {
    fn default() -> Self {
        Shared {
            drop_replies: Mutex::default(),
            reset_requests: Mutex::default(),
            refusals: Mutex::default(),
            latency: Mutex::default(),
            stalled_until: watch::channel(None).0,
            counters: Counters::default(),
        }
    }
}

impl Shared {
    /// Takes one shot of the first armed refusal `message` matches: its (code, message).
    fn take_refusal(&self, message: &[u8]) -> Option<(i32, String)> {
        if header(message, 12) != OP_MSG {
            return None; // only an OP_MSG can be answered with an OP_MSG
        }
        let mut refusals = self.refusals.lock().unwrap();
        let i = refusals
            .iter()
            .position(|(f, _, _)| f.target.matches(message))?;
        let (fault, code, text) = &mut refusals[i];
        fault.left -= 1;
        let refusal = (*code, text.clone());
        if fault.left == 0 {
            refusals.remove(i);
        }
        Some(refusal)
    }

    /// Takes one shot of the first armed fault in `faults` that `message` matches.
    fn take(faults: &Mutex<Vec<Armed>>, message: &[u8]) -> bool {
        let mut faults = faults.lock().unwrap();
        let Some(i) = faults.iter().position(|f| f.target.matches(message)) else {
            return false;
        };
        faults[i].left -= 1;
        if faults[i].left == 0 {
            faults.remove(i);
        }
        true
    }

    /// Waits out a stall, if one is on.
    async fn hold(&self) {
        let mut stall = self.stalled_until.subscribe();
        loop {
            let until = *stall.borrow_and_update();
            match until {
                Some(until) if until > Instant::now() => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(until.into()) => {}
                        _ = stall.changed() => {}
                    }
                }
                _ => return,
            }
        }
    }
}

/// A running fault proxy in front of one MongoDB server.
pub struct FaultProxy {
    uri: String,
    address: SocketAddr,
    shared: Arc<Shared>,
    /// Bumped by [`FaultProxy::reset_all`]: every connection open then closes.
    resets: watch::Sender<u64>,
    /// Dropping it stops the proxy's thread.
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl FaultProxy {
    /// Starts a proxy in front of the (single) server of `uri`, on a free local port.
    pub fn start(uri: &str) -> Result<FaultProxy, String> {
        let (prefix, upstream, suffix) = split_host(uri)?;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        listener.set_nonblocking(true).map_err(|e| e.to_string())?;
        let address = listener.local_addr().map_err(|e| e.to_string())?;
        let shared = Arc::new(Shared::default());
        let (resets, resets_rx) = watch::channel(0u64);
        let (stop, stop_rx) = tokio::sync::oneshot::channel();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("fault-proxy")
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let serving = shared.clone();
        std::thread::Builder::new()
            .name("fault-proxy".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = TcpListener::from_std(listener).expect("register the listener");
                    tokio::select! {
                        _ = accept_loop(listener, upstream, serving, resets_rx) => {}
                        _ = stop_rx => {}
                    }
                });
                runtime.shutdown_background();
            })
            .map_err(|e| e.to_string())?;
        Ok(FaultProxy {
            uri: format!("{prefix}{address}{suffix}"),
            address,
            shared,
            resets,
            _stop: stop,
        })
    }

    /// The server's URI with the proxy in its place.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The next `count` requests matching `target` are forwarded, and their replies swallowed
    /// (each closing its connection): the server applied them, the client never hears.
    pub fn drop_replies(&self, target: Target, count: u64) {
        self.shared.drop_replies.lock().unwrap().push(Armed {
            target,
            left: count,
        });
    }

    /// The next `count` requests matching `target` are not forwarded: their connection is
    /// closed instead.
    pub fn reset_requests(&self, target: Target, count: u64) {
        self.shared.reset_requests.lock().unwrap().push(Armed {
            target,
            left: count,
        });
    }

    /// The next `count` requests (`OP_MSG`) matching `target` are not forwarded but answered
    /// with `{ok: 0, code, errmsg: message}`, as a server refusing them would answer: e.g.
    /// code 18 (`AuthenticationFailed`) for bad credentials, 13 (`Unauthorized`).
    pub fn refuse(&self, target: Target, count: u64, code: i32, message: &str) {
        self.shared.refusals.lock().unwrap().push((
            Armed {
                target,
                left: count,
            },
            code,
            message.to_string(),
        ));
    }

    /// Closes every connection open now (new ones are accepted as usual).
    pub fn reset_all(&self) {
        self.resets.send_modify(|n| *n += 1);
    }

    /// Delays every request by `latency` (zero: none).
    pub fn set_latency(&self, latency: Duration) {
        *self.shared.latency.lock().unwrap() = latency;
    }

    /// Holds all traffic, both ways and new connections too, for `duration` from now.
    pub fn stall(&self, duration: Duration) {
        self.shared
            .stalled_until
            .send_replace(Some(Instant::now() + duration));
    }

    /// Ends a stall now.
    pub fn resume(&self) {
        self.shared.stalled_until.send_replace(None);
    }

    /// Disarms every fault that has not fired yet, and ends latency and stalls.
    pub fn clear(&self) {
        self.shared.drop_replies.lock().unwrap().clear();
        self.shared.reset_requests.lock().unwrap().clear();
        self.shared.refusals.lock().unwrap().clear();
        self.set_latency(Duration::ZERO);
        self.resume();
    }

    /// Faults armed and not fired yet (drops and resets).
    pub fn armed(&self) -> u64 {
        let left = |faults: &Mutex<Vec<Armed>>| -> u64 {
            faults.lock().unwrap().iter().map(|f| f.left).sum()
        };
        let refusals: u64 = self
            .shared
            .refusals
            .lock()
            .unwrap()
            .iter()
            .map(|(f, _, _)| f.left)
            .sum();
        left(&self.shared.drop_replies) + left(&self.shared.reset_requests) + refusals
    }

    pub fn stats(&self) -> FaultStats {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        FaultStats {
            connections: get(&c.connections),
            dropped_replies: get(&c.dropped_replies),
            reset_requests: get(&c.reset_requests),
            reset_connections: get(&c.reset_connections),
            requests: get(&c.requests),
            refused: get(&c.refused),
        }
    }

    /// Waits until every armed fault has fired (polling; the proxy runs on its own thread), up
    /// to `within`; returns whether they did.
    pub async fn wait_fired(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while self.armed() > 0 {
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: String,
    shared: Arc<Shared>,
    resets: watch::Receiver<u64>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            // Out of file descriptors or the like: let it pass rather than spin.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        shared.counters.connections.fetch_add(1, Ordering::Relaxed);
        let (upstream, shared, resets) = (upstream.clone(), shared.clone(), resets.clone());
        tokio::spawn(async move {
            shared.hold().await;
            if let Ok(server) = TcpStream::connect(&upstream).await {
                connection(client, server, shared, resets).await;
            }
        });
    }
}

/// Why a connection's forwarding stopped.
enum Closed {
    /// A fault closes it: abortively, as a broken link.
    Fault,
    /// A side closed it or failed.
    Io,
}

/// Forwards one client connection until a side closes it or a fault does.
async fn connection(
    client: TcpStream,
    server: TcpStream,
    shared: Arc<Shared>,
    mut resets: watch::Receiver<u64>,
) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    resets.borrow_and_update();
    let swallow = Mutex::new(HashSet::<i32>::new());
    let (mut client_rd, client_wr) = client.into_split();
    let (mut server_rd, mut server_wr) = server.into_split();
    // Both directions write to the client: replies, and refusals made in the server's place.
    let client_wr = tokio::sync::Mutex::new(client_wr);
    let requests = async {
        loop {
            let Ok(message) = read_message(&mut client_rd).await else {
                return Closed::Io;
            };
            shared.hold().await;
            let latency = *shared.latency.lock().unwrap();
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            if let Some((code, text)) = shared.take_refusal(&message) {
                let reply = refusal(header(&message, 4), code, &text);
                if client_wr.lock().await.write_all(&reply).await.is_err() {
                    return Closed::Io;
                }
                shared.counters.refused.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if Shared::take(&shared.reset_requests, &message) {
                shared
                    .counters
                    .reset_requests
                    .fetch_add(1, Ordering::Relaxed);
                return Closed::Fault;
            }
            if Shared::take(&shared.drop_replies, &message) {
                swallow.lock().unwrap().insert(header(&message, 4));
            }
            if server_wr.write_all(&message).await.is_err() {
                return Closed::Io;
            }
            shared.counters.requests.fetch_add(1, Ordering::Relaxed);
        }
    };
    let replies = async {
        loop {
            let Ok(message) = read_message(&mut server_rd).await else {
                return Closed::Io;
            };
            shared.hold().await;
            if swallow.lock().unwrap().remove(&header(&message, 8)) {
                shared
                    .counters
                    .dropped_replies
                    .fetch_add(1, Ordering::Relaxed);
                return Closed::Fault;
            }
            if client_wr.lock().await.write_all(&message).await.is_err() {
                return Closed::Io;
            }
        }
    };
    let closed = tokio::select! {
        closed = requests => closed,
        closed = replies => closed,
        _ = resets.changed() => {
            shared.counters.reset_connections.fetch_add(1, Ordering::Relaxed);
            Closed::Fault
        }
    };
    if let Closed::Fault = closed {
        // Abortive close (RST): what a dropped link or a killed peer looks like. A zero linger
        // never blocks the thread, which is why tokio deprecates the setter for other values.
        if let Ok(client) = client_rd.reunite(client_wr.into_inner()) {
            #[allow(deprecated)]
            let _ = client.set_linger(Some(Duration::ZERO));
        }
    }
}

/// Reads one wire-protocol message (header included).
async fn read_message(stream: &mut (impl AsyncReadExt + Unpin)) -> io::Result<Vec<u8>> {
    let mut length = [0u8; 4];
    stream.read_exact(&mut length).await?;
    let length = i32::from_le_bytes(length);
    if !(16..=64 * 1024 * 1024).contains(&length) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("message length {length}"),
        ));
    }
    let mut message = vec![0u8; length as usize];
    message[..4].copy_from_slice(&length.to_le_bytes());
    stream.read_exact(&mut message[4..]).await?;
    Ok(message)
}

/// The header's int32 at `offset` (4: requestID, 8: responseTo, 12: opCode).
fn header(message: &[u8], offset: usize) -> i32 {
    message
        .get(offset..offset + 4)
        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .unwrap_or(0)
}

const OP_QUERY: i32 = 2004;
const OP_MSG: i32 = 2013;

/// An `OP_MSG` reply to request `request_id`: `{ok: 0, errmsg, code}`.
fn refusal(request_id: i32, code: i32, message: &str) -> Vec<u8> {
    let body =
        mongodb::bson::doc! {"ok": 0.0, "errmsg": message, "code": code, "codeName": "Refused"};
    let mut document = Vec::new();
    body.to_writer(&mut document)
        .expect("a document serialises");
    let length = (16 + 4 + 1 + document.len()) as i32;
    let mut reply = Vec::with_capacity(length as usize);
    reply.extend_from_slice(&length.to_le_bytes());
    reply.extend_from_slice(&0i32.to_le_bytes()); // requestID
    reply.extend_from_slice(&request_id.to_le_bytes()); // responseTo
    reply.extend_from_slice(&OP_MSG.to_le_bytes());
    reply.extend_from_slice(&0u32.to_le_bytes()); // flagBits
    reply.push(0); // section kind 0: the body
    reply.extend_from_slice(&document);
    reply
}

/// A request's command name: the first key of its command document.
pub fn command_name(message: &[u8]) -> Option<String> {
    let document = match header(message, 12) {
        // flagBits, then section kind 0 (the body) first.
        OP_MSG if message.get(20) == Some(&0) => 21,
        // flags, fullCollectionName, numberToSkip, numberToReturn, then the query.
        OP_QUERY => {
            let name_end = 20 + message.get(20..)?.iter().position(|b| *b == 0)?;
            name_end + 1 + 8
        }
        _ => return None,
    };
    // The document's length (4), the first element's type (1), then its key.
    let key = message.get(document + 5..)?;
    let end = key.iter().position(|b| *b == 0)?;
    let name = String::from_utf8_lossy(&key[..end]).into_owned();
    // A legacy query may wrap the command: {$query: {isMaster: 1}, ...}.
    if name == "$query" {
        let inner = document + 5 + end + 1;
        let key = message.get(inner + 5..)?;
        let end = key.iter().position(|b| *b == 0)?;
        return Some(String::from_utf8_lossy(&key[..end]).into_owned());
    }
    Some(name)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

/// `mongodb://[user:pass@]host:port/rest` -> (`mongodb://[user:pass@]`, `host:port`, `/rest`).
fn split_host(uri: &str) -> Result<(String, String, String), String> {
    let scheme_end = uri
        .find("://")
        .ok_or_else(|| format!("not a MongoDB URI: {uri}"))?
        + 3;
    if uri.starts_with("mongodb+srv") {
        return Err("the fault proxy needs a plain mongodb:// URI with one host".into());
    }
    let rest = &uri[scheme_end..];
    let host_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..host_end];
    let host_start = authority.rfind('@').map_or(0, |at| at + 1);
    let host = &authority[host_start..];
    if host.contains(',') {
        return Err("the fault proxy fronts one host; this URI names several".into());
    }
    let mut suffix = rest[host_end..].to_string();
    // Through the proxy the driver must not discover the real members and go around it.
    if !suffix.contains("directConnection") {
        suffix = match suffix.find('?') {
            Some(_) => format!("{suffix}&directConnection=true"),
            None if suffix.is_empty() => "/?directConnection=true".into(),
            None => format!("{suffix}?directConnection=true"),
        };
    }
    Ok((
        format!("{}{}", &uri[..scheme_end], &authority[..host_start]),
        host.to_string(),
        suffix,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An OP_MSG whose body is `{<command>: "coll"}`.
    fn op_msg(command: &str) -> Vec<u8> {
        let mut body = vec![0, 0, 0, 0, 0x02];
        body.extend_from_slice(command.as_bytes());
        body.push(0);
        body.extend_from_slice(&5i32.to_le_bytes());
        body.extend_from_slice(b"coll\0");
        body.push(0);
        let n = body.len() as i32;
        body[..4].copy_from_slice(&n.to_le_bytes());
        let mut m = Vec::new();
        m.extend_from_slice(&(16 + 4 + 1 + n).to_le_bytes());
        m.extend_from_slice(&7i32.to_le_bytes());
        m.extend_from_slice(&0i32.to_le_bytes());
        m.extend_from_slice(&OP_MSG.to_le_bytes());
        m.extend_from_slice(&0u32.to_le_bytes());
        m.push(0);
        m.extend_from_slice(&body);
        m
    }

    #[test]
    fn a_request_is_matched_by_its_command_and_its_bytes() {
        let update = op_msg("update");
        assert_eq!(command_name(&update).as_deref(), Some("update"));
        assert!(Target::command("update").matches(&update));
        assert!(!Target::command("updat").matches(&update));
        assert!(Target::command("update")
            .containing("coll")
            .matches(&update));
        assert!(!Target::command("update")
            .containing("dirty")
            .matches(&update));
        assert!(Target::any().matches(&update));
    }

    #[test]
    fn the_proxy_takes_the_servers_place_in_the_uri() {
        let (prefix, host, suffix) =
            split_host("mongodb://u:p@127.0.0.1:27017/?directConnection=true").unwrap();
        assert_eq!(
            (prefix.as_str(), host.as_str(), suffix.as_str()),
            (
                "mongodb://u:p@",
                "127.0.0.1:27017",
                "/?directConnection=true"
            )
        );
        let (_, _, suffix) = split_host("mongodb://h:1/?replicaSet=rs0").unwrap();
        assert_eq!(suffix, "/?replicaSet=rs0&directConnection=true");
        assert!(split_host("mongodb://a:1,b:2/").is_err());
    }
}
