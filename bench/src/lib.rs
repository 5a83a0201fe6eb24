//! The load tool's fixture servers, also a library: `tests/it/remote_pool.rs` runs the
//! remote fixture in the test process ([`remote::spawn`]). The load tool itself is
//! `main.rs`.

pub mod fixture;
pub mod remote;
pub mod search;

/// A fixture server started by the bench stops when the bench closes its stdin.
pub fn exit_when_stdin_closes() {
    tokio::spawn(async {
        let mut buf = [0u8; 64];
        let mut stdin = tokio::io::stdin();
        while matches!(tokio::io::AsyncReadExt::read(&mut stdin, &mut buf).await, Ok(n) if n > 0) {}
        std::process::exit(0);
    });
}
