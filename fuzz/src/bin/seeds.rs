//! Writes the seed corpora (fuzz/corpus/<target>/) from the wire-snapshot examples, so every
//! run starts from valid messages of every kind.

#[path = "../../../protocol/tests/examples/mod.rs"]
mod examples;

use std::path::Path;

use cuinterpose_protocol as p;

fn write(dir: &Path, target: &str, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let folder = dir.join(target);
    std::fs::create_dir_all(&folder)?;
    std::fs::write(folder.join(name), bytes)
}

fn main() -> std::io::Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let encode = |value: &dyn Fn() -> Result<Vec<u8>, p::EncodeError>| {
        value().map_err(|error| std::io::Error::other(error.to_string()))
    };
    for (name, request) in examples::requests() {
        write(&dir, "request", name, &encode(&|| p::encode(&request))?)?;
    }
    for (name, reply) in examples::replies() {
        write(&dir, "reply", name, &encode(&|| p::encode(&reply))?)?;
    }
    write(
        &dir,
        "state_file",
        "example",
        &encode(&|| p::encode(&examples::state_file()))?,
    )?;
    write(
        &dir,
        "ticket",
        "example",
        &encode(&|| p::encode(&examples::ticket()))?,
    )?;
    write(
        &dir,
        "layouts",
        "virtual_shareable_handle",
        &examples::virtual_shareable_handle().encode(),
    )?;
    write(
        &dir,
        "layouts",
        "ipc_mem_handle",
        &examples::ipc_mem_handle().encode(),
    )?;
    write(
        &dir,
        "layouts",
        "pool_pointer_handle",
        &examples::pool_pointer_handle().encode(),
    )?;
    let schema =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("../schema/protocol.ron"))?;
    write(&dir, "schema", "protocol", &schema)?;
    println!("seed corpora written to {}", dir.display());
    Ok(())
}
