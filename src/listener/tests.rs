use std::net::{Ipv4Addr, SocketAddr};

use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::net::TcpSocket;
use tokio::time::Instant;

use super::*;

const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

fn guarded(admission: &Arc<Admission>, handshake_bytes: u64) -> (Guarded<DuplexStream>, DuplexStream) {
    let slot = admission.admit(LOCAL).expect("under the caps");
    let limits = admission.limits();
    let (server, client) = tokio::io::duplex(1024);
    (Guarded::new(server, slot, handshake_bytes, limits.handshake_timeout, limits.idle_timeout), client)
}

async fn read_until_error(conn: &mut Guarded<DuplexStream>) -> io::Error {
    let mut buf = [0u8; 64];
    loop {
        match conn.read(&mut buf).await {
            Ok(0) => panic!("unexpected end of stream"),
            Ok(_) => {}
            Err(e) => return e,
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_silent_connection_is_closed_at_the_handshake_timeout() {
    let admission = Admission::new(ConnectionLimits::default());
    let (mut conn, _client) = guarded(&admission, PREFACE_LEN);
    let start = Instant::now();
    let error = read_until_error(&mut conn).await;
    assert_eq!(error.kind(), io::ErrorKind::TimedOut);
    assert_eq!(start.elapsed(), ConnectionLimits::default().handshake_timeout);
    assert_eq!(admission.counts().handshake_timeouts, 1);
    drop(conn);
    assert_eq!(admission.counts().open, 0, "the slot is returned");
}

#[tokio::test(start_paused = true)]
async fn a_peer_dribbling_bytes_does_not_finish_its_handshake() {
    let admission = Admission::new(ConnectionLimits::default());
    let (mut conn, mut client) = guarded(&admission, PREFACE_LEN);
    tokio::spawn(async move {
        for _ in 0..PREFACE_LEN {
            if client.write_all(b"P").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
    });
    let start = Instant::now();
    assert_eq!(read_until_error(&mut conn).await.kind(), io::ErrorKind::TimedOut);
    assert_eq!(start.elapsed(), ConnectionLimits::default().handshake_timeout);
    assert_eq!(admission.counts().handshake_timeouts, 1);
}

#[tokio::test(start_paused = true)]
async fn a_client_is_closed_only_after_a_whole_idle_period_of_silence() {
    let limits = ConnectionLimits::default();
    let admission = Admission::new(limits);
    let (mut conn, mut client) = guarded(&admission, PREFACE_LEN);
    let talker = tokio::spawn(async move {
        client.write_all(&[0u8; PREFACE_LEN as usize]).await.unwrap();
        tokio::time::sleep(Duration::from_secs(200)).await;
        client.write_all(b"ping ack").await.unwrap();
        client
    });
    let start = Instant::now();
    assert_eq!(read_until_error(&mut conn).await.kind(), io::ErrorKind::TimedOut);
    // Armed at the handshake deadline (10 s), re-armed at 310 s because a byte came at 200 s,
    // fired with nothing new at 610 s.
    assert_eq!(start.elapsed(), limits.handshake_timeout + limits.idle_timeout * 2);
    let counts = admission.counts();
    assert_eq!((counts.handshake_timeouts, counts.idle_timeouts), (0, 1));
    drop(talker);
}

async fn connect_from(ip: Ipv4Addr, to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(ip.into(), 0)).unwrap();
    socket.connect(to).await.unwrap()
}

/// Reads until the server closes the connection (end of stream or reset).
async fn closed_by_server(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 8];
    matches!(tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await, Ok(Ok(0) | Err(_)))
}

#[tokio::test]
async fn accepted_connections_have_nagle_off_and_caps_apply_per_peer_and_in_total() {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let limits = ConnectionLimits { max_connections: 3, max_connections_per_peer: 2, ..Default::default() };
    let admission = Admission::new(limits);
    let mut incoming = incoming(listener, admission.clone(), Plaintext);

    let _a = connect_from(Ipv4Addr::LOCALHOST, addr).await;
    let _b = connect_from(Ipv4Addr::LOCALHOST, addr).await;
    let first = incoming.next().await.unwrap().unwrap();
    assert!(first.get_ref().nodelay().unwrap(), "TCP_NODELAY is set on every accepted socket");
    let _second = incoming.next().await.unwrap().unwrap();

    let mut third_from_same_peer = connect_from(Ipv4Addr::LOCALHOST, addr).await;
    assert!(closed_by_server(&mut third_from_same_peer).await);
    assert_eq!(admission.counts().refused_peer_cap, 1);

    let _other_peer = connect_from(Ipv4Addr::new(127, 0, 0, 2), addr).await;
    let _third = incoming.next().await.unwrap().unwrap();
    assert_eq!(admission.counts().open, 3);

    let mut over_total = connect_from(Ipv4Addr::new(127, 0, 0, 3), addr).await;
    assert!(closed_by_server(&mut over_total).await);
    assert_eq!(admission.counts().refused_total_cap, 1);

    drop(first);
    let _again = connect_from(Ipv4Addr::new(127, 0, 0, 3), addr).await;
    let admitted = incoming.next().await.unwrap().unwrap();
    assert_eq!(admitted.get_ref().peer_addr().unwrap().ip(), IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3)));
}
