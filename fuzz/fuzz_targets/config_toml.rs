//! The server's config file, as `rota serve --config FILE` reads it.
//!
//! `config::resolve` takes a path, so each input is written to a file in a scratch folder
//! (`$TMPDIR/rota-fuzz-config/`) and resolved from there with no overrides, and the same file's
//! policies are loaded as `rota serve` loads them. Nothing may panic. When both succeed and no
//! token is configured, what `rota serve --print-config` would print (`Settings::to_toml`
//! followed by the policies' `to_toml`) must resolve again to the same printout.
//!
//! The scratch folder holds a certificate (also under a name with an unusual character), its
//! key and two token files, so inputs can reach the TLS and token paths. Inputs that name any other file (any path outside the folder, or
//! with `..`) are skipped: the fuzzer must not read `/dev/zero` or the machine's files.

#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use rota::config::{Overrides, resolve};
use rota::policy::file as policy_file;

const CERT: &str = include_str!("../fixtures/cert.pem");
const KEY: &str = include_str!("../fixtures/key.pem");

struct Scratch {
    dir: PathBuf,
    input: PathBuf,
    printed: PathBuf,
}

fn scratch() -> &'static Scratch {
    static SCRATCH: OnceLock<Scratch> = OnceLock::new();
    SCRATCH.get_or_init(|| {
        let dir = std::env::temp_dir().join("rota-fuzz-config");
        std::fs::create_dir_all(&dir).expect("scratch folder");
        for (name, text) in [
            ("cert.pem", CERT),
            // A legal file name with a character (U+00AD, soft hyphen) that Rust's `{:?}`
            // escapes as `\u{ad}`, which TOML does not accept.
            ("soft\u{ad}hyphen.pem", CERT),
            ("key.pem", KEY),
            ("token", "0123456789abcdef-long-enough-token\n"),
            ("short-token", "tiny\n"),
        ] {
            std::fs::write(dir.join(name), text).expect("scratch file");
        }
        let pid = std::process::id();
        Scratch {
            input: dir.join(format!("input-{pid}.toml")),
            printed: dir.join(format!("printed-{pid}.toml")),
            dir,
        }
    })
}

/// Removes this run's files, whatever way the run ends.
struct Cleanup(&'static Scratch);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0.input);
        let _ = std::fs::remove_file(&self.0.printed);
    }
}

/// Whether every file the config names is inside the scratch folder.
fn names_only_scratch_files(text: &str, dir: &Path) -> bool {
    // Text that is not TOML is refused by `resolve` before any file is read.
    let Ok(table) = text.parse::<toml::Table>() else { return true };
    let inside = |value: &toml::Value| match value.as_str() {
        Some(path) => {
            let path = Path::new(path);
            path.starts_with(dir) && path.components().all(|c| matches!(c, std::path::Component::Normal(_) | std::path::Component::RootDir))
        }
        None => true,
    };
    let server_files = table.get("server").and_then(|s| s.as_table()).is_none_or(|server| {
        ["tls_cert", "tls_key", "tls_client_ca"].iter().filter_map(|key| server.get(*key)).all(inside)
    });
    let token_files = table
        .get("auth")
        .and_then(|a| a.as_table())
        .and_then(|auth| auth.get("tokens"))
        .and_then(|t| t.as_array())
        .is_none_or(|tokens| {
            tokens.iter().filter_map(|t| t.as_table()).filter_map(|t| t.get("token_file")).all(inside)
        });
    server_files && token_files
}

fuzz_target!(|data: &[u8]| {
    let scratch = scratch();
    // A config file must be UTF-8; other bytes only reach the "cannot read" error.
    let Ok(text) = std::str::from_utf8(data) else { return };
    if !names_only_scratch_files(text, &scratch.dir) {
        return;
    }
    let _cleanup = Cleanup(scratch);
    std::fs::write(&scratch.input, text).expect("write the input");
    let settings = match resolve(Some(&scratch.input), &Overrides::default()) {
        Ok(settings) => settings,
        Err(error) => {
            let _ = error.to_string();
            return;
        }
    };
    let policies = match policy_file::load(&scratch.input) {
        Ok(policies) => policies,
        Err(error) => {
            let _ = error.to_string();
            return;
        }
    };
    if settings.serve.auth.is_some() {
        // Tokens are not printed, and a non-loopback listener without them is refused.
        return;
    }
    let printed = settings.to_toml() + &policy_file::to_toml(&policies);
    std::fs::write(&scratch.printed, &printed).expect("write the printout");
    let again = resolve(Some(&scratch.printed), &Overrides::default())
        .unwrap_or_else(|e| panic!("--print-config output is refused: {e}\n--- input\n{text}\n--- printed\n{printed}"));
    let policies_again = policy_file::load(&scratch.printed)
        .unwrap_or_else(|e| panic!("--print-config policies are refused: {e}\n--- input\n{text}\n--- printed\n{printed}"));
    let reprinted = again.to_toml() + &policy_file::to_toml(&policies_again);
    assert_eq!(reprinted, printed, "--print-config output reads back differently\n--- input\n{text}");
});
