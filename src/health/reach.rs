//! Which addresses the health checks connect to.
//!
//! An instance's address is whatever its provider (or a followed registry) announced, so a
//! check is a connection rota makes on someone else's say-so. Two rules bound it:
//!
//! - rota's own listeners (gRPC, admin) are never checked: an instance announced at one of
//!   them fails at once, with that reason, and no connection is made;
//! - every other address must lie in `server.health_check_networks` ([`Networks`]): a list of
//!   networks, each allowing (`10.0.0.0/8`) or refusing (`!10.0.5.0/24`) the addresses in it,
//!   the longest match deciding. Its default ([`Networks::default_for`]) refuses link-local
//!   addresses (cloud metadata services live there), and loopback unless every listener of
//!   rota is on loopback itself.
//!
//! The unspecified addresses (`0.0.0.0`, `::`), which reach this host, are never checked. An
//! IPv4-mapped IPv6 address (`::ffff:127.0.0.1`) is judged as the IPv4 address it carries.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

/// Most entries `server.health_check_networks` may hold.
pub const MAX_NETWORKS: usize = 256;

/// The setting's key, for the reasons given.
const SETTING: &str = "server.health_check_networks";

/// One network: an address and how many of its leading bits count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Network {
    addr: IpAddr,
    prefix: u8,
}

impl Network {
    fn bits(ip: IpAddr) -> (u128, u8) {
        match ip {
            IpAddr::V4(v4) => (u128::from(u32::from(v4)), 32),
            IpAddr::V6(v6) => (u128::from(v6), 128),
        }
    }

    fn mask(width: u8, prefix: u8) -> u128 {
        let all = if width == 128 { u128::MAX } else { (1u128 << width) - 1 };
        if prefix == 0 { 0 } else { (all << (width - prefix)) & all }
    }

    fn contains(&self, ip: IpAddr) -> bool {
        if self.addr.is_ipv4() != ip.is_ipv4() {
            return false;
        }
        let (net, width) = Self::bits(self.addr);
        let (ip, _) = Self::bits(ip);
        let mask = Self::mask(width, self.prefix);
        net & mask == ip & mask
    }
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// The networks health checks may reach: each entry allows (or, written `!NETWORK`, refuses)
/// the addresses in it; the longest entry that holds an address decides (an allowing and a
/// refusing entry of one length: refused), and an address no entry holds is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Networks {
    entries: Vec<(Network, bool)>,
}

impl Networks {
    /// Reads `10.0.0.0/8, fd00::/8, !10.0.5.0/24` (an address alone is one host); the problem,
    /// said for people, otherwise.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut entries = Vec::new();
        for (i, entry) in text.split(',').enumerate() {
            let entry = entry.trim();
            if entry.is_empty() {
                return Err(format!(
                    "entry {} is empty; expected networks like 10.0.0.0/8, separated by commas",
                    i + 1
                ));
            }
            let (allow, network) = match entry.strip_prefix('!') {
                Some(rest) => (false, rest.trim()),
                None => (true, entry),
            };
            entries.push((parse_network(network)?, allow));
            if entries.len() > MAX_NETWORKS {
                return Err(format!("names more than {MAX_NETWORKS} networks"));
            }
        }
        Ok(Self { entries })
    }

    /// rota's default for listeners on `listeners`: every address but link-local ones
    /// (`169.254.0.0/16`, where cloud metadata services answer, and `fe80::/10`), and but
    /// loopback (`127.0.0.0/8`, `::1`) unless every listener is on loopback: then only programs
    /// on this host can read a verdict, and those can connect to its loopback themselves, while
    /// providers registered on 127.0.0.1 (local development, tests) are checked.
    pub fn default_for(listeners: impl IntoIterator<Item = IpAddr>) -> Self {
        let local_only = listeners.into_iter().all(|ip| ip.to_canonical().is_loopback());
        let text = if local_only {
            "0.0.0.0/0, ::/0, !169.254.0.0/16, !fe80::/10"
        } else {
            "0.0.0.0/0, ::/0, !127.0.0.0/8, !::1/128, !169.254.0.0/16, !fe80::/10"
        };
        Self::parse(text).expect("the default networks parse")
    }

    /// Whether `ip` lies in an allowing entry longer than every refusing entry that holds it.
    pub fn allows(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        let mut best: Option<(u8, bool)> = None;
        for (network, allow) in &self.entries {
            if !network.contains(ip) {
                continue;
            }
            best = match best {
                Some((prefix, _)) if prefix > network.prefix => best,
                Some((prefix, false)) if prefix == network.prefix => best,
                _ => Some((network.prefix, *allow)),
            };
        }
        best.is_some_and(|(_, allow)| allow)
    }
}

impl fmt::Display for Networks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (network, allow)) in self.entries.iter().enumerate() {
            let separator = if i == 0 { "" } else { ", " };
            let bang = if *allow { "" } else { "!" };
            write!(f, "{separator}{bang}{network}")?;
        }
        Ok(())
    }
}

fn parse_network(text: &str) -> Result<Network, String> {
    let (addr, prefix) = match text.split_once('/') {
        Some((addr, prefix)) => (addr, Some(prefix)),
        None => (text, None),
    };
    let addr: IpAddr =
        addr.parse().map_err(|_| format!("{text:?} is not a network like 10.0.0.0/8, fd00::/8 or 192.0.2.7"))?;
    let width = if addr.is_ipv4() { 32 } else { 128 };
    let prefix = match prefix {
        None => width,
        Some(prefix) => match prefix.parse::<u8>() {
            Ok(prefix) if prefix <= width => prefix,
            _ => return Err(format!("{text:?}: the prefix must be a whole number from 0 to {width}")),
        },
    };
    if let IpAddr::V6(v6) = addr
        && v6.to_ipv4_mapped().is_some()
    {
        return Err(format!(
            "{text:?} is an IPv4-mapped IPv6 network; write it as IPv4 (mapped addresses are judged as IPv4)"
        ));
    }
    let network = Network { addr, prefix };
    let (bits, _) = Network::bits(addr);
    if bits & !Network::mask(width, prefix) != 0 {
        let base = match addr {
            IpAddr::V4(_) => IpAddr::V4(std::net::Ipv4Addr::from((bits & Network::mask(width, prefix)) as u32)),
            IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::from(bits & Network::mask(width, prefix))),
        };
        return Err(format!("{text:?} has bits set past its prefix; the network is {base}/{prefix}"));
    }
    Ok(network)
}

/// What the health checks may connect to: the networks allowed, and rota's own listeners,
/// which are never checked.
#[derive(Debug, Clone)]
pub struct Reach {
    networks: Networks,
    /// Each listener's bound address and name (`gRPC`, `admin`).
    own: Vec<(SocketAddr, &'static str)>,
}

impl Reach {
    pub fn new(networks: Networks, own: Vec<(SocketAddr, &'static str)>) -> Self {
        Self { networks, own }
    }

    pub fn networks(&self) -> &Networks {
        &self.networks
    }

    /// Why `addr` is not checked, or `None` when it may be.
    pub fn refusal(&self, addr: SocketAddr) -> Option<String> {
        let ip = addr.ip().to_canonical();
        let shown = SocketAddr::new(ip, addr.port());
        if ip.is_unspecified() {
            return Some(format!("not checked: {shown} is the unspecified address, which reaches rota's own host"));
        }
        for (listener, name) in &self.own {
            if listener.port() != addr.port() {
                continue;
            }
            let bound = listener.ip().to_canonical();
            if bound == ip || (bound.is_unspecified() && is_local(ip)) {
                return Some(format!("not checked: {shown} is rota's own {name} listener"));
            }
        }
        if !self.networks.allows(ip) {
            return Some(format!("not checked: {ip} is outside {SETTING}"));
        }
        None
    }
}

/// Whether `ip` is one of this host's addresses (a listener bound to the unspecified address
/// answers on each of them): loopback, or an address a socket can be bound to here.
fn is_local(ip: IpAddr) -> bool {
    ip.is_loopback() || std::net::UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn the_longest_match_decides_and_an_address_no_entry_holds_is_refused() {
        let networks = Networks::parse("10.0.0.0/8, !10.0.5.0/24, 10.0.5.7, fd00::/8").unwrap();
        assert!(networks.allows(ip("10.1.2.3")));
        assert!(!networks.allows(ip("10.0.5.6")), "the refusing /24 is longer than the /8");
        assert!(networks.allows(ip("10.0.5.7")), "the host is longer still");
        assert!(networks.allows(ip("fd12::1")));
        assert!(!networks.allows(ip("192.168.1.1")), "no entry holds it");
        assert!(!networks.allows(ip("::ffff:192.168.1.1")));
        assert!(networks.allows(ip("::ffff:10.1.2.3")), "a mapped address is judged as IPv4");
        let tie = Networks::parse("10.0.0.0/8, !10.0.0.0/8").unwrap();
        assert!(!tie.allows(ip("10.0.0.1")), "of one length, refusing wins");
        let everything = Networks::parse("0.0.0.0/0, ::/0").unwrap();
        assert!(everything.allows(ip("127.0.0.1")) && everything.allows(ip("::1")));
    }

    #[test]
    fn the_default_refuses_link_local_and_loopback_unless_rota_listens_on_loopback_only() {
        let exposed = Networks::default_for([ip("0.0.0.0"), ip("127.0.0.1")]);
        for refused in ["127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1", "169.254.169.254", "fe80::1"] {
            assert!(!exposed.allows(ip(refused)), "{refused}");
        }
        for allowed in ["10.1.2.3", "192.0.2.7", "2001:db8::1"] {
            assert!(exposed.allows(ip(allowed)), "{allowed}");
        }
        let local = Networks::default_for([ip("127.0.0.1"), ip("::1")]);
        assert!(local.allows(ip("127.0.0.1")) && local.allows(ip("::1")) && local.allows(ip("10.1.2.3")));
        assert!(!local.allows(ip("169.254.169.254")) && !local.allows(ip("fe80::1")));
        assert_eq!(local.to_string(), "0.0.0.0/0, ::/0, !169.254.0.0/16, !fe80::/10");
        assert_eq!(Networks::parse(&exposed.to_string()).unwrap(), exposed, "printed, read back the same");
    }

    #[test]
    fn a_bad_list_is_refused_saying_what_is_wrong() {
        let cases = [
            ("", "entry 1 is empty"),
            ("10.0.0.0/8,", "entry 2 is empty"),
            ("10.0.0/8", "\"10.0.0/8\" is not a network"),
            ("10.0.0.0/33", "the prefix must be a whole number from 0 to 32"),
            ("::/129", "from 0 to 128"),
            ("10.0.0.0/x", "the prefix must be"),
            ("10.0.0.1/8", "has bits set past its prefix; the network is 10.0.0.0/8"),
            ("fd00::1/8", "the network is fd00::/8"),
            ("::ffff:10.0.0.0/104", "IPv4-mapped"),
            ("!", "\"\" is not a network"),
        ];
        for (text, problem) in cases {
            let error = Networks::parse(text).unwrap_err();
            assert!(error.contains(problem), "{text:?}: {error}");
        }
        let many = vec!["10.0.0.1"; MAX_NETWORKS + 1].join(",");
        assert!(Networks::parse(&many).unwrap_err().contains("more than 256"));
        assert!(Networks::parse(&vec!["10.0.0.1"; MAX_NETWORKS].join(",")).is_ok());
    }

    #[test]
    fn rotas_own_listeners_and_the_unspecified_address_are_never_checked() {
        let admin: SocketAddr = "127.0.0.1:9090".parse().unwrap();
        let grpc: SocketAddr = "[::]:50051".parse().unwrap();
        let reach = Reach::new(Networks::parse("0.0.0.0/0, ::/0").unwrap(), vec![(grpc, "gRPC"), (admin, "admin")]);
        let refusal = |text: &str| reach.refusal(text.parse().unwrap());
        assert_eq!(refusal("127.0.0.1:9090").unwrap(), "not checked: 127.0.0.1:9090 is rota's own admin listener");
        assert_eq!(
            refusal("[::ffff:127.0.0.1]:9090").unwrap(),
            "not checked: 127.0.0.1:9090 is rota's own admin listener"
        );
        assert_eq!(refusal("127.0.0.1:9091"), None);
        // Bound to every address: each of this host's reaches it.
        assert_eq!(refusal("127.0.0.1:50051").unwrap(), "not checked: 127.0.0.1:50051 is rota's own gRPC listener");
        assert_eq!(refusal("[::1]:50051").unwrap(), "not checked: [::1]:50051 is rota's own gRPC listener");
        assert_eq!(
            refusal("0.0.0.0:8080").unwrap(),
            "not checked: 0.0.0.0:8080 is the unspecified address, which reaches rota's own host"
        );
        assert!(refusal("[::]:8080").unwrap().contains("unspecified"));
        let narrow = Reach::new(Networks::parse("10.0.0.0/8").unwrap(), vec![]);
        assert_eq!(
            narrow.refusal("127.0.0.1:80".parse().unwrap()).unwrap(),
            "not checked: 127.0.0.1 is outside server.health_check_networks"
        );
    }
}
