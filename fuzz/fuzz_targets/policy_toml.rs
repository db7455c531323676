//! The policy part of the config file (`[defaults]`, `[services.NAME]`).
//!
//! Any text goes to `rota::policy::file::parse`; it must never panic. `rota serve
//! --print-config` shows operators an accepted set through `policy::file::to_toml`, as a file
//! they may keep, so that output must parse back to the same effective policies (defaults and
//! every service's resolved policy) and print identically a second time.

#![no_main]

use libfuzzer_sys::fuzz_target;
use rota::policy::file;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(set) = file::parse(text) else { return };
    let printed = file::to_toml(&set);
    let again = file::parse(&printed)
        .unwrap_or_else(|e| panic!("to_toml output does not parse: {e}\n--- input\n{text}\n--- printed\n{printed}"));
    assert_eq!(
        again.defaults, set.defaults,
        "defaults changed in the round trip\n--- input\n{text}\n--- printed\n{printed}"
    );
    let mut names: Vec<&String> = set.services.keys().collect();
    names.sort();
    let mut again_names: Vec<&String> = again.services.keys().collect();
    again_names.sort();
    assert_eq!(again_names, names, "services changed in the round trip\n--- input\n{text}\n--- printed\n{printed}");
    for name in names {
        assert_eq!(
            again.services[name], set.services[name],
            "services.{name} changed in the round trip\n--- input\n{text}\n--- printed\n{printed}"
        );
    }
    let reprinted = file::to_toml(&again);
    assert_eq!(reprinted, printed, "to_toml is not stable\n--- input\n{text}");
});
