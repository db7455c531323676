//! A bare HTTP/2 gRPC client for clients that misbehave on purpose: one that binds the address
//! it connects from, sets its streams' flow-control window (zero: rota may send headers but no
//! data) and sends calls whose answers it may never read.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;
use tokio::net::TcpSocket;

/// One connection; dropping the handle (and every response) closes it.
pub struct RawConnection {
    send: h2::client::SendRequest<Bytes>,
}

impl RawConnection {
    /// Connects from `from` to `server`; its streams start with a window of `window` bytes.
    pub async fn open(from: Ipv4Addr, server: SocketAddr, window: u32) -> std::io::Result<Self> {
        let socket = TcpSocket::new_v4()?;
        socket.bind(SocketAddr::new(IpAddr::V4(from), 0))?;
        let tcp = socket.connect(server).await?;
        // The largest connection window: h2 closes a connection on which many small DATA frames
        // wait unread beyond half of it, and these clients leave answers unread on purpose.
        let (send, connection) = h2::client::Builder::new()
            .initial_window_size(window)
            .initial_connection_window_size((1 << 31) - 1)
            .handshake(tcp)
            .await
            .map_err(std::io::Error::other)?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Self { send })
    }

    /// Opens a streaming call of `path`: its request stream, to send messages on with
    /// [`message_frame`], and its answer.
    pub async fn stream(&self, path: &str) -> Result<(h2::SendStream<Bytes>, h2::client::ResponseFuture), h2::Error> {
        let mut send = self.send.clone().ready().await?;
        let request = http::Request::post(format!("http://rota{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .expect("a valid request");
        let (response, body) = send.send_request(request, false)?;
        Ok((body, response))
    }

    /// Sends one call of `path` with `message` as its only request and returns the answer's
    /// headers; the body is left to the caller to read, or not.
    pub async fn call(&self, path: &str, message: &impl Message) -> Result<http::Response<h2::RecvStream>, h2::Error> {
        let (mut body, response) = self.stream(path).await?;
        body.send_data(message_frame(message), true)?;
        response.await
    }
}

/// `message` as a gRPC message: a 5-byte prefix and its encoding.
pub fn message_frame(message: &impl Message) -> Bytes {
    let encoded = message.encode_to_vec();
    let mut frame = BytesMut::with_capacity(5 + encoded.len());
    frame.put_u8(0);
    frame.put_u32(encoded.len() as u32);
    frame.put_slice(&encoded);
    frame.freeze()
}

/// Takes the gRPC messages complete in `buffer` off its front.
pub fn messages<M: Message + Default>(buffer: &mut BytesMut) -> Result<Vec<M>, prost::DecodeError> {
    let mut out = Vec::new();
    while buffer.len() >= 5 {
        let len = u32::from_be_bytes([buffer[1], buffer[2], buffer[3], buffer[4]]) as usize;
        if buffer.len() < 5 + len {
            break;
        }
        let frame = buffer.split_to(5 + len);
        out.push(M::decode(&frame[5..])?);
    }
    Ok(out)
}

/// The `grpc-status` and decoded `grpc-message` of an answer that ended in its headers (a
/// refusal); `None` for an answer whose data follows.
pub fn refusal(response: &http::Response<h2::RecvStream>) -> Option<(String, String)> {
    let status = response.headers().get("grpc-status")?.to_str().ok()?.to_owned();
    let message = response.headers().get("grpc-message").and_then(|m| m.to_str().ok()).unwrap_or_default();
    Some((status, percent_decoded(message)))
}

/// gRPC messages are percent-encoded; rota's are ASCII, so each escape is one byte.
fn percent_decoded(message: &str) -> String {
    let mut decoded = String::new();
    let mut rest = message;
    while let Some(at) = rest.find('%') {
        decoded.push_str(&rest[..at]);
        match rest.get(at + 1..at + 3).and_then(|hex| u8::from_str_radix(hex, 16).ok()) {
            Some(byte) => {
                decoded.push(byte as char);
                rest = &rest[at + 3..];
            }
            None => {
                decoded.push('%');
                rest = &rest[at + 1..];
            }
        }
    }
    decoded.push_str(rest);
    decoded
}

/// Reads a whole answer body, giving its window back as it goes; the bytes read.
pub async fn read_all(response: http::Response<h2::RecvStream>) -> Result<usize, h2::Error> {
    let mut body = response.into_body();
    let mut read = 0;
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        read += chunk.len();
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    Ok(read)
}

#[cfg(test)]
mod tests {
    #[test]
    fn messages_are_percent_decoded_and_stray_signs_kept() {
        assert_eq!(super::percent_decoded("a%20b%3B%2"), "a b;%2");
        assert_eq!(super::percent_decoded("plain"), "plain");
    }
}
