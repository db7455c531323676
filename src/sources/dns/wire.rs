//! The DNS messages the DNS source sends and reads (RFC 1035, SRV from RFC 2782): one
//! question out, the answer's A, AAAA and SRV records in.
//!
//! Answers are untrusted: every length is checked against the message, compression pointers
//! may only point backwards and are followed a bounded number of times, names are at most 255
//! bytes, and anything malformed is an error, never a panic.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub const TYPE_A: u16 = 1;
pub const TYPE_CNAME: u16 = 5;
pub const TYPE_AAAA: u16 = 28;
pub const TYPE_SRV: u16 = 33;
const CLASS_IN: u16 = 1;
const MAX_NAME: usize = 255;
/// Compression pointers followed while reading one name.
const MAX_JUMPS: usize = 32;
/// Records read from one answer, over all sections.
pub const MAX_RECORDS: usize = 4096;

/// The answer code of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rcode {
    NoError,
    /// The name does not exist.
    NxDomain,
    /// Anything else (`SERVFAIL`, `REFUSED`, …), by number.
    Other(u8),
}

/// One record rota uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Data {
    Address(IpAddr),
    Srv {
        priority: u16,
        weight: u16,
        port: u16,
        target: String,
    },
    /// A CNAME, or a type rota does not read.
    Other,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Lower case, without the final dot.
    pub name: String,
    pub ttl: u32,
    pub data: Data,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub id: u16,
    pub rcode: Rcode,
    /// The answer did not fit (UDP): ask again over TCP.
    pub truncated: bool,
    pub question: Option<(String, u16)>,
    pub answers: Vec<Record>,
    pub additional: Vec<Record>,
}

/// A query for `name` (`type_`), recursion desired.
pub fn query(id: u16, name: &str, type_: u16) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(name.len() + 18);
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&0x0100u16.to_be_bytes()); // RD
    out.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
    let name = name.trim_end_matches('.');
    if name.is_empty() || name.len() > 253 {
        return Err(format!("{name:?} is not a DNS name"));
    }
    for label in name.split('.') {
        if label.is_empty()
            || label.len() > 63
            || !label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(format!("{name:?} is not a DNS name (label {label:?})"));
        }
        out.push(label.len() as u8);
        out.extend_from_slice(label.as_bytes());
    }
    out.push(0);
    out.extend_from_slice(&type_.to_be_bytes());
    out.extend_from_slice(&CLASS_IN.to_be_bytes());
    Ok(out)
}

struct Reader<'a> {
    message: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|end| *end <= self.message.len()).ok_or("the answer is cut short")?;
        let bytes = &self.message[self.at..end];
        self.at = end;
        Ok(bytes)
    }

    fn u16(&mut self) -> Result<u16, String> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A name at the cursor, following compression pointers (backwards only).
    fn name(&mut self) -> Result<String, String> {
        let mut name = String::new();
        let mut at = self.at;
        let mut jumps = 0;
        let mut resume = None;
        loop {
            let len = *self.message.get(at).ok_or("a name runs past the answer")? as usize;
            match len & 0xC0 {
                0x00 => {
                    at += 1;
                    if len == 0 {
                        break;
                    }
                    let label = self.message.get(at..at + len).ok_or("a name runs past the answer")?;
                    if name.len() + len + 1 > MAX_NAME {
                        return Err("a name is longer than 255 bytes".into());
                    }
                    if !name.is_empty() {
                        name.push('.');
                    }
                    name.extend(label.iter().map(|b| b.to_ascii_lowercase() as char));
                    at += len;
                }
                0xC0 => {
                    let low = *self.message.get(at + 1).ok_or("a name runs past the answer")? as usize;
                    let target = ((len & 0x3F) << 8) | low;
                    if target >= at || jumps >= MAX_JUMPS {
                        return Err("a name's compression pointer loops".into());
                    }
                    jumps += 1;
                    resume.get_or_insert(at + 2);
                    at = target;
                }
                _ => return Err("a name has a label type DNS does not define".into()),
            }
        }
        self.at = resume.unwrap_or(at);
        Ok(name)
    }
}

/// Reads an answer.
pub fn parse(message: &[u8]) -> Result<Answer, String> {
    let mut r = Reader { message, at: 0 };
    let id = r.u16()?;
    let flags = r.u16()?;
    if flags & 0x8000 == 0 {
        return Err("the message is a query, not an answer".into());
    }
    let rcode = match (flags & 0x000F) as u8 {
        0 => Rcode::NoError,
        3 => Rcode::NxDomain,
        other => Rcode::Other(other),
    };
    let truncated = flags & 0x0200 != 0;
    let (qd, an, ns, ar) = (r.u16()? as usize, r.u16()? as usize, r.u16()? as usize, r.u16()? as usize);
    if an + ns + ar > MAX_RECORDS || qd > 1 {
        return Err(format!(
            "the answer has {qd} questions and {} records; at most 1 and {MAX_RECORDS} are read",
            an + ns + ar
        ));
    }
    let mut question = None;
    if qd == 1 {
        let name = r.name()?;
        let type_ = r.u16()?;
        r.u16()?;
        question = Some((name, type_));
    }
    let mut answers = Vec::with_capacity(an);
    let mut additional = Vec::with_capacity(ar);
    for section in 0..3 {
        let count = [an, ns, ar][section];
        for _ in 0..count {
            let record = record(&mut r)?;
            match section {
                0 => answers.push(record),
                2 => additional.push(record),
                _ => {}
            }
        }
    }
    Ok(Answer { id, rcode, truncated, question, answers, additional })
}

fn record(r: &mut Reader<'_>) -> Result<Record, String> {
    let name = r.name()?;
    let type_ = r.u16()?;
    let class = r.u16()?;
    let ttl = r.u32()?;
    let length = r.u16()? as usize;
    let start = r.at;
    let rdata = r.take(length)?;
    let data = match (type_, class) {
        (TYPE_A, CLASS_IN) if length == 4 => {
            Data::Address(IpAddr::V4(Ipv4Addr::new(rdata[0], rdata[1], rdata[2], rdata[3])))
        }
        (TYPE_AAAA, CLASS_IN) if length == 16 => {
            let octets: [u8; 16] = rdata.try_into().map_err(|_| "an AAAA record is not 16 bytes")?;
            Data::Address(IpAddr::V6(Ipv6Addr::from(octets)))
        }
        (TYPE_A | TYPE_AAAA, CLASS_IN) => return Err(format!("an address record of {name} has {length} bytes")),
        (TYPE_SRV, CLASS_IN) => {
            // The target may be compressed against the rest of the message.
            let mut inner = Reader { message: &r.message[..start + length], at: start };
            let (priority, weight, port) = (inner.u16()?, inner.u16()?, inner.u16()?);
            let target = inner.name()?;
            Data::Srv { priority, weight, port, target }
        }
        _ => Data::Other,
    };
    // TTLs with the top bit set are read as zero (RFC 2181).
    let ttl = if ttl > i32::MAX as u32 { 0 } else { ttl };
    Ok(Record { name, ttl, data })
}

/// Answers built by hand, for the tests of the source's reading.
#[cfg(test)]
pub mod testing {
    /// An answer to `query`, with `records` as (name, type, ttl, rdata) in the answer section.
    pub fn answer(query: &[u8], rcode: u8, records: &[(&str, u16, u32, Vec<u8>)]) -> Vec<u8> {
        let mut out = query.to_vec();
        out[2] = 0x81;
        out[3] = 0x80 | rcode;
        out[6..8].copy_from_slice(&(records.len() as u16).to_be_bytes());
        for (name, type_, ttl, rdata) in records {
            if *name == "@" {
                out.extend_from_slice(&[0xC0, 12]);
            } else {
                for label in name.split('.') {
                    out.push(label.len() as u8);
                    out.extend_from_slice(label.as_bytes());
                }
                out.push(0);
            }
            out.extend_from_slice(&type_.to_be_bytes());
            out.extend_from_slice(&1u16.to_be_bytes());
            out.extend_from_slice(&ttl.to_be_bytes());
            out.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
            out.extend_from_slice(rdata);
        }
        out
    }

    pub fn srv(priority: u16, weight: u16, port: u16, target: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for v in [priority, weight, port] {
            out.extend_from_slice(&v.to_be_bytes());
        }
        out.extend_from_slice(target);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{answer, srv};
    use super::*;

    #[test]
    fn a_query_and_its_answer_round_trip_with_compressed_names() {
        let q = query(7, "_grpc._tcp.Svc.Test.", TYPE_SRV).unwrap();
        let target = [5, b'h', b'o', b's', b't', b'1', 0xC0, 12 + 11];
        let a = answer(
            &q,
            0,
            &[("@", TYPE_SRV, 5, srv(0, 10, 9001, &target)), ("host1.svc.test", TYPE_A, 7, vec![127, 0, 0, 1])],
        );
        let parsed = parse(&a).unwrap();
        assert_eq!((parsed.id, parsed.rcode, parsed.truncated), (7, Rcode::NoError, false));
        assert_eq!(parsed.question, Some(("_grpc._tcp.svc.test".to_owned(), TYPE_SRV)));
        assert_eq!(parsed.answers[0].name, "_grpc._tcp.svc.test");
        assert_eq!(
            parsed.answers[0].data,
            Data::Srv { priority: 0, weight: 10, port: 9001, target: "host1.svc.test".into() }
        );
        assert_eq!(parsed.answers[1].data, Data::Address("127.0.0.1".parse().unwrap()));
        assert_eq!(parsed.answers[1].ttl, 7);
    }

    #[test]
    fn nxdomain_and_truncation_are_read_from_the_flags() {
        let q = query(1, "nope.test", TYPE_A).unwrap();
        let mut a = answer(&q, 3, &[]);
        assert_eq!(parse(&a).unwrap().rcode, Rcode::NxDomain);
        a[2] |= 0x02;
        assert!(parse(&a).unwrap().truncated);
        assert_eq!(parse(&answer(&q, 2, &[])).unwrap().rcode, Rcode::Other(2));
        assert!(parse(&q).is_err(), "a query is not an answer");
    }

    #[test]
    fn malformed_answers_are_errors() {
        let q = query(1, "a.test", TYPE_A).unwrap();
        let good = answer(&q, 0, &[("@", TYPE_A, 1, vec![1, 2, 3, 4])]);
        for cut in 0..good.len() {
            assert!(parse(&good[..cut]).is_err(), "cut at {cut}");
        }
        let short_a = answer(&q, 0, &[("@", TYPE_A, 1, vec![1, 2, 3])]);
        assert!(parse(&short_a).is_err());
        // A pointer to itself.
        let mut looping = answer(&q, 0, &[("@", TYPE_A, 1, vec![1, 2, 3, 4])]);
        let at = q.len();
        looping[at] = 0xC0;
        looping[at + 1] = at as u8;
        assert!(parse(&looping).unwrap_err().contains("loops"));
        assert!(query(1, "bad name.test", TYPE_A).is_err());
        assert!(query(1, &"a".repeat(64), TYPE_A).is_err());
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_parse_or_fail_without_panicking(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..600)) {
            let _ = parse(&bytes);
        }
    }
}
