//! A newcomer's first run: `topology apply` on a prefix with no ladder, then
//! `order-expiry demo` on it (which applies it again), print no ERROR line,
//! and the demo sees nothing early and nothing missed.
//!
//! Both commands look for ladder levels that must not exist (the level-count
//! guard), and the broker answers each look with a 404 that lapin logs at ERROR
//! unless the service's log filter knows it was expected.

use order_expiry_testkit::{World, settings_env};
use tokio::process::Command;

async fn run(world: &World, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_order-expiry"))
        .args(args)
        .envs(settings_env(&world.settings))
        .env("ORDER_EXPIRY__LOG__FORMAT", "text")
        .env_remove("RUST_LOG")
        .output()
        .await
        .expect("the binary runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "order-expiry {args:?} failed:\n{text}"
    );
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_apply_and_demo_print_no_error() {
    let world = World::builder()
        .declare(false)
        .build()
        .await
        .expect("world");
    let apply = run(&world, &["topology", "apply"]).await;
    let demo = run(
        &world,
        &[
            "demo",
            "--orders",
            "10",
            "--min-delay",
            "1s",
            "--max-delay",
            "3s",
        ],
    )
    .await;
    for (command, output) in [("topology apply", &apply), ("demo", &demo)] {
        assert!(
            !output.contains("ERROR"),
            "{command} printed an ERROR line:\n{output}"
        );
    }
    assert!(
        demo.contains("early 0") && demo.contains("still unpaid 0"),
        "{demo}"
    );
    world.cleanup().await;
}
