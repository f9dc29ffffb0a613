//! The multi-process tests on DynamoDB Local, one binary (without the test harness): each
//! test's parent starts this binary again as its children (`--child TEST …`) and talks to
//! them over their stdin and stdout. Run with no argument, it runs every test one after
//! another; with arguments, the tests whose names contain one of them. A test whose name
//! starts with `long_` runs only when named exactly.

#![allow(clippy::print_stdout, clippy::print_stderr)]

#[path = "../dynamo/mod.rs"]
mod dynamo;
mod dynamo_faults;
mod dynamo_keys;
mod dynamo_killed;
mod dynamo_outages;
mod dynamo_priorities;
mod dynamo_processes;
mod dynamo_renewed;
mod dynamo_shadow_processes;
mod dynamo_skew;
mod dynamo_waiters;
#[path = "../faults/mod.rs"]
mod faults;
mod global_store;

fn main() {
    dynamo::worker::dispatch(&[
        ("dynamo_processes", dynamo_processes::main),
        ("dynamo_waiters", dynamo_waiters::main),
        ("dynamo_shadow_processes", dynamo_shadow_processes::main),
        ("dynamo_faults", dynamo_faults::main),
        ("dynamo_keys", dynamo_keys::main),
        ("dynamo_outages", dynamo_outages::main),
        ("dynamo_killed", dynamo_killed::main),
        ("dynamo_renewed", dynamo_renewed::main),
        ("long_slot_held_ten_minutes", dynamo_renewed::ten_minutes),
        ("dynamo_skew", dynamo_skew::main),
        ("dynamo_priorities", dynamo_priorities::main),
        ("global_store", global_store::main),
    ]);
}
