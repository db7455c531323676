//! What the registries rota follows answer: a Eureka applications document, a DNS message and
//! etcd's JSON gateway answers (a range, a watch line) are untrusted input. Each reader gets
//! every input; nothing may panic, and what a reader accepts keeps to its bounds.

#![no_main]

use libfuzzer_sys::fuzz_target;
use rota::sources::{dns, etcd, eureka};

fuzz_target!(|data: &[u8]| {
    if let Ok((usable, refused)) = eureka::read(data) {
        assert!(usable.len() + refused.len() <= data.len(), "every instance takes bytes");
    }
    if let Ok(answer) = dns::wire::parse(data) {
        assert!(answer.answers.len() + answer.additional.len() <= dns::wire::MAX_RECORDS);
    }
    if let Ok((keys, _, _)) = etcd::parse_range(data, "svc/", 16) {
        assert!(keys.len() <= 16, "a range keeps to max_instances");
    }
    let _ = etcd::parse_watch(data, "svc/");
    let _ = etcd::parse_watch(data, "");
});
