//! Compiles `proto/rota/v1/*.proto` into Rust with prost and tonic.
//!
//! The build is self-contained: `protoc` comes from the `protoc-bin-vendored` crate, so no system
//! compiler is needed. The encoded descriptor set is written next to the generated code for
//! server reflection.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; prost-build reads PROTOC from the environment.
    unsafe { std::env::set_var("PROTOC", protoc) };

    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let protos = ["proto/rota/v1/rota.proto"];
    for proto in &protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("rota_descriptor.bin"))
        .compile_protos(&protos, &["proto"])?;
    Ok(())
}
