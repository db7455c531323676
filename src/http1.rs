//! One HTTP/1.1 connection to an address rota was given (a followed source, an instance's
//! health check): connected with Nagle off, and driven beside its requests until dropped.

use http_body::Body;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Why no connection was made.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{0}")]
    Connect(std::io::Error),
    #[error("{0}")]
    Handshake(hyper::Error),
}

/// An open connection: requests go through `sender`; dropping `driver` (with the rest, or
/// kept alone while an answer's body is read) ends the task that drives it.
pub struct Connection<B> {
    pub sender: SendRequest<B>,
    pub driver: Driver,
}

/// The task that drives a connection, ended when this is dropped.
pub struct Driver(tokio::task::JoinHandle<()>);

impl Drop for Driver {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Connects to `host:port` and makes the HTTP/1.1 handshake.
pub async fn open<B>(host: &str, port: u16) -> Result<Connection<B>, OpenError>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = TcpStream::connect((host, port)).await.map_err(OpenError::Connect)?;
    let _ = stream.set_nodelay(true);
    let (sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(OpenError::Handshake)?;
    let driver = Driver(tokio::spawn(async move {
        let _ = connection.await;
    }));
    Ok(Connection { sender, driver })
}
