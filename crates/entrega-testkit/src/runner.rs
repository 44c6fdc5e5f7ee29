//! Running whole suites, and the macros that turn each scenario into its own test.

use crate::harness::{
    BoxError, DlqHarness, InboxHarness, LogHarness, OutboxHarness, ParkingHarness, Scenario,
};
use crate::harness_delivery::DeliveryHarness;
use crate::suite::{delivery, dlq, inbox, log, outbox, parking};

/// Collects the failures of scenarios run one after another.
#[derive(Debug, Default)]
struct Report(Vec<String>);

impl Report {
    fn record(&mut self, name: &str, result: Scenario) {
        if let Err(e) = result {
            self.0.push(format!("{name}: {e}"));
        }
    }

    fn finish(self) -> Scenario {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(BoxError::from(self.0.join("\n")))
        }
    }
}

macro_rules! run_each {
    ($report:ident, $h:ident, $($module:ident :: $name:ident),+ $(,)?) => {
        $( $report.record(stringify!($name), $module::$name($h).await); )+
    };
}

/// Runs every outbox scenario; the error lists each failed scenario with its reason.
pub async fn run_all_outbox(h: &dyn OutboxHarness) -> Scenario {
    let mut report = Report::default();
    run_each!(
        report,
        h,
        outbox::rolled_back_enqueue_leaves_nothing,
        outbox::pending_follows_insertion_order,
        outbox::mark_requires_valid_lease,
        outbox::owners_converge_to_disjoint_lanes,
        outbox::expired_owner_is_taken_over_and_fenced,
        outbox::restarted_owner_takes_its_lanes_back_at_once,
        outbox::late_commit_is_still_pending,
        outbox::purge_removes_published_by_age,
        outbox::status_reports_backlog,
        outbox::wakeup_returns_after_commit,
        outbox::pending_lanes_matches_each_lane,
        outbox::mark_lanes_fences_each_lane,
        outbox::pending_lanes_after_reads_past_the_cursor,
        outbox::refused_row_holds_back_only_its_aggregate,
        outbox::refused_row_keeps_its_aggregate_in_order,
        outbox::held_row_waits_for_release,
        outbox::refusal_requires_valid_lease,
    );
    report.finish()
}

/// Runs every delivery scenario (any transport, log or queue); the error lists each failed
/// scenario with its reason.
pub async fn run_all_delivery(h: &dyn DeliveryHarness) -> Scenario {
    let mut report = Report::default();
    run_each!(
        report,
        h,
        delivery::unknown_topic_is_refused,
        delivery::key_headers_and_payload_arrive_unchanged,
        delivery::each_key_arrives_in_order,
        delivery::uncommitted_come_again_and_committed_do_not,
        delivery::members_share_partitions_and_a_leaver_hands_over,
        delivery::seek_serves_again_and_pause_holds_one_partition,
    );
    report.finish()
}

/// Runs every inbox scenario; the error lists each failed scenario with its reason.
pub async fn run_all_inbox(h: &dyn InboxHarness) -> Scenario {
    let mut report = Report::default();
    run_each!(
        report,
        h,
        inbox::claim_new_then_duplicate,
        inbox::same_id_for_two_consumers,
        inbox::rolled_back_claim_leaves_nothing,
        inbox::purge_by_age,
    );
    report.finish()
}

/// Runs every parking scenario; the error lists each failed scenario with its reason.
pub async fn run_all_parking(h: &dyn ParkingHarness) -> Scenario {
    let mut report = Report::default();
    run_each!(
        report,
        h,
        parking::head_is_lowest_offset_of_the_key,
        parking::parking_again_keeps_the_first_copy,
        parking::keys_and_subscriptions_stay_apart,
    );
    report.finish()
}

/// Runs every dead-letter operator store scenario; the error lists each failed scenario.
pub async fn run_all_dlq(h: &dyn DlqHarness) -> Scenario {
    let mut report = Report::default();
    run_each!(
        report,
        h,
        dlq::fresh_store_is_empty,
        dlq::record_keeps_marks_and_entry,
        dlq::later_mark_replaces_earlier,
        dlq::audit_is_newest_first,
    );
    report.finish()
}

/// Runs every log transport scenario; the error lists each failed scenario with its reason.
pub async fn run_all_log(h: &dyn LogHarness) -> Scenario {
    let mut report = Report::default();
    run_each!(
        report,
        h,
        log::ensure_topic_is_idempotent,
        log::unknown_topic_is_rejected,
        log::key_order_and_placement,
        log::headers_round_trip,
        log::concurrent_publishers_gap_free,
        log::resume_from_committed_offset,
        log::uncommitted_records_are_redelivered,
        log::two_members_split_partitions,
        log::silent_member_loses_partitions,
        log::stale_commit_is_refused,
        log::restarted_member_takes_its_partitions_back_at_once,
        log::seek_redelivers,
        log::pause_holds_one_partition,
    );
    report.finish()
}

/// Expands to one `#[tokio::test]` per scenario of a module, each building its harness with
/// the given expression. Used by the three public macros; the calling crate needs `tokio`.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests {
    ($module:ident, $harness:expr, $($name:ident),+ $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() -> $crate::Scenario {
                let harness = $harness;
                $crate::$module::$name(&harness).await
            }
        )+
    };
}

/// One test per outbox scenario: `entrega_testkit::outbox_conformance!(MyHarness::new());`
/// inside a test module. The expression runs once per test.
#[macro_export]
macro_rules! outbox_conformance {
    ($harness:expr) => {
        $crate::__conformance_tests!(
            outbox,
            $harness,
            rolled_back_enqueue_leaves_nothing,
            pending_follows_insertion_order,
            mark_requires_valid_lease,
            owners_converge_to_disjoint_lanes,
            expired_owner_is_taken_over_and_fenced,
            restarted_owner_takes_its_lanes_back_at_once,
            late_commit_is_still_pending,
            purge_removes_published_by_age,
            status_reports_backlog,
            wakeup_returns_after_commit,
            pending_lanes_matches_each_lane,
            mark_lanes_fences_each_lane,
            pending_lanes_after_reads_past_the_cursor,
            refused_row_holds_back_only_its_aggregate,
            refused_row_keeps_its_aggregate_in_order,
            held_row_waits_for_release,
            refusal_requires_valid_lease,
        );
    };
}

/// One test per inbox scenario: `entrega_testkit::inbox_conformance!(MyHarness::new());`.
#[macro_export]
macro_rules! inbox_conformance {
    ($harness:expr) => {
        $crate::__conformance_tests!(
            inbox,
            $harness,
            claim_new_then_duplicate,
            same_id_for_two_consumers,
            rolled_back_claim_leaves_nothing,
            purge_by_age,
        );
    };
}

/// One test per parking scenario: `entrega_testkit::parking_conformance!(MyHarness::new());`.
#[macro_export]
macro_rules! parking_conformance {
    ($harness:expr) => {
        $crate::__conformance_tests!(
            parking,
            $harness,
            head_is_lowest_offset_of_the_key,
            parking_again_keeps_the_first_copy,
            keys_and_subscriptions_stay_apart,
        );
    };
}

/// One test per log transport scenario: `entrega_testkit::log_conformance!(MyHarness::new());`.
#[macro_export]
macro_rules! log_conformance {
    ($harness:expr) => {
        $crate::__conformance_tests!(
            log,
            $harness,
            ensure_topic_is_idempotent,
            unknown_topic_is_rejected,
            key_order_and_placement,
            headers_round_trip,
            concurrent_publishers_gap_free,
            resume_from_committed_offset,
            uncommitted_records_are_redelivered,
            two_members_split_partitions,
            silent_member_loses_partitions,
            stale_commit_is_refused,
            restarted_member_takes_its_partitions_back_at_once,
            seek_redelivers,
            pause_holds_one_partition,
        );
    };
}

/// One test per delivery scenario, for any transport (log or queue):
/// `entrega_testkit::delivery_conformance!(MyHarness::new());`.
#[macro_export]
macro_rules! delivery_conformance {
    ($harness:expr) => {
        $crate::__conformance_tests!(
            delivery,
            $harness,
            unknown_topic_is_refused,
            key_headers_and_payload_arrive_unchanged,
            each_key_arrives_in_order,
            uncommitted_come_again_and_committed_do_not,
            members_share_partitions_and_a_leaver_hands_over,
            seek_serves_again_and_pause_holds_one_partition,
        );
    };
}

/// One test per dead-letter operator store scenario:
/// `entrega_testkit::dlq_conformance!(MyHarness::new());`.
#[macro_export]
macro_rules! dlq_conformance {
    ($harness:expr) => {
        $crate::__conformance_tests!(
            dlq,
            $harness,
            fresh_store_is_empty,
            record_keeps_marks_and_entry,
            later_mark_replaces_earlier,
            audit_is_newest_first,
            action_lock_has_one_holder,
        );
    };
}
