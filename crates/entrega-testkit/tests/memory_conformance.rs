//! The in-memory fakes pass the same suites as the database backends, which keeps both the
//! fakes and the scenarios honest.

mod outbox {
    entrega_testkit::outbox_conformance!(entrega_testkit::memory::MemoryHarness);
}

mod inbox {
    entrega_testkit::inbox_conformance!(entrega_testkit::memory::MemoryHarness);
}

mod parking {
    entrega_testkit::parking_conformance!(entrega_testkit::memory::MemoryHarness);
}

mod log {
    entrega_testkit::log_conformance!(entrega_testkit::memory::MemoryHarness);
}

mod dlq {
    entrega_testkit::dlq_conformance!(entrega_testkit::memory::MemoryHarness);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_all_reports_every_suite() -> entrega_testkit::Scenario {
    let h = entrega_testkit::memory::MemoryHarness;
    entrega_testkit::run_all_outbox(&h).await?;
    entrega_testkit::run_all_inbox(&h).await?;
    entrega_testkit::run_all_parking(&h).await?;
    entrega_testkit::run_all_dlq(&h).await?;
    entrega_testkit::run_all_log(&h).await
}
