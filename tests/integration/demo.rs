//! A newcomer's first run: `topology apply` on a prefix with no ladder, then
//! `order-expiry demo` on it (which applies it again), print no ERROR line,
//! and the demo sees nothing early and nothing missed.
//!
//! Both commands look for ladder levels that must not exist (the level-count
//! guard), and the broker answers each look with a 404 that lapin logs at ERROR
//! unless the service's log filter knows it was expected.

use order_expiry_testkit::{World, succeeded};

/// What `order-expiry COMMAND` (text logs) printed on stdout and stderr; it
/// must succeed and print no ERROR line.
async fn run(world: &World, command: &str) -> String {
    let args: Vec<&str> = command.split(' ').collect();
    let out = world
        .cli(&args, &[("ORDER_EXPIRY__LOG__FORMAT", "text")])
        .await;
    let text = succeeded(command, &out) + &String::from_utf8_lossy(&out.stderr);
    assert!(
        !text.contains("ERROR"),
        "{command} printed an ERROR line:\n{text}"
    );
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_apply_and_demo_print_no_error() {
    let world = World::builder().declare(false).build().await;
    let world = world.expect("world");
    run(&world, "topology apply").await;
    let demo = run(&world, "demo --orders 10 --min-delay 1s --max-delay 3s").await;
    assert!(
        demo.contains("early 0") && demo.contains("still unpaid 0"),
        "{demo}"
    );
    world.cleanup().await;
}
