//! One turn of a goose user: the next buyer's purchase (two at once for a twin), sent,
//! classified and counted.

use std::sync::atomic::Ordering;
use std::time::Duration;

use goose::prelude::*;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::Cancel;
use super::plan::{FINAL, Plan, Shelf, TRIED, UNTRIED};
use super::tally::Tally;

/// What one request got back.
struct Answer {
    status: Option<u16>,
    code: String,
    elapsed: Duration,
    /// When the request was sent, since the attack started, in µs.
    sent_us: u64,
}

async fn send(plan: &Plan, host: &str, product: i64, buyer: u64) -> Answer {
    let url = format!("{host}/api/products/{product}/purchase");
    let sent_us = plan.since_start_us();
    let sent = Instant::now();
    let answer = plan
        .client
        .post(&url)
        .bearer_auth(crate::buyers::token(buyer as i64))
        .json(&json!({"user_id": buyer, "quantity": 1}))
        .send()
        .await;
    let (status, code) = match answer {
        Ok(response) => {
            let status = response.status().as_u16();
            let body = response.json::<Value>().await.unwrap_or(Value::Null);
            let code = body["error"].as_str().unwrap_or_default().to_owned();
            (Some(status), code)
        }
        Err(error) => (None, error.to_string()),
    };
    Answer {
        status,
        code,
        elapsed: sent.elapsed(),
        sent_us,
    }
}

/// One turn of a goose user: the next buyer's purchase (two at once for a twin), classified
/// and recorded in goose's metrics.
///
/// 409 sold out / already purchased are expected outcomes of a flash sale, not errors. A
/// request made through goose's HTTP helpers is counted as an error for any non-2xx
/// answer, and goose 0.19 keeps it in its errors table even after `set_success`; so the
/// request is sent here and recorded with `record_custom_request_duration`, which takes
/// our own judgement of success. Only 503s and worse appear as errors in goose's reports.
pub(super) async fn purchase(user: &mut GooseUser, plan: &Plan) -> TransactionResult {
    if plan.extras.cancel.as_ref().is_some_and(Cancel::is_set) {
        goose::trigger_killswitch("Ctrl-C");
        // Yield until goose stops this user: a transaction that returns at once would spin.
        tokio::time::sleep(Duration::from_millis(20)).await;
        return Ok(());
    }
    plan.user_started(user.weighted_users_index);
    let Some(buyer) = plan
        .next_buyer()
        .filter(|_| !plan.decided.load(Ordering::SeqCst))
    else {
        plan.check_decided();
        // Nothing left to do until goose stops this user.
        tokio::time::sleep(Duration::from_millis(20)).await;
        return Ok(());
    };
    let index = (buyer - 1) as usize;
    // Only an untried buyer becomes tried: a buyer another user has just finished stays
    // final (two users can work on one buyer at the tail, when fewer buyers are open than
    // users).
    let first = plan.buyers[index]
        .compare_exchange(UNTRIED, TRIED, Ordering::SeqCst, Ordering::SeqCst)
        .is_ok();
    let shelf = plan.shelf_of(buyer);
    let product = shelf.product.id;
    if first {
        shelf.tried.fetch_add(1, Ordering::SeqCst);
    }
    let hosts = plan.hosts.len() as u64;
    let host = &plan.hosts[(buyer % hosts) as usize];
    let twin = first && buyer % 10 == 0 && shelf.tally.count(&shelf.tally.sold_out) == 0;
    let answers = if twin {
        for tally in [&plan.tally, &shelf.tally] {
            tally.twins.fetch_add(1, Ordering::Relaxed);
        }
        let other = &plan.hosts[((buyer + 1) % hosts) as usize];
        let (a, b) = tokio::join!(
            send(plan, host, product, buyer),
            send(plan, other, product, buyer)
        );
        vec![a, b]
    } else {
        vec![send(plan, host, product, buyer).await]
    };
    let mut final_answer = false;
    for answer in &answers {
        final_answer |= record(plan, shelf, buyer, twin, answer);
        let error = error_of(answer);
        user.record_custom_request_duration(
            "POST",
            "/api/products/{id}/purchase",
            answer.elapsed,
            error.is_none(),
            answer.status,
            error.as_deref(),
        )
        .await?;
    }
    if final_answer && plan.buyers[index].swap(FINAL, Ordering::SeqCst) != FINAL {
        shelf.answered.fetch_add(1, Ordering::SeqCst);
    }
    plan.maybe_restock(shelf).await;
    plan.check_decided();
    Ok(())
}

/// Count one answer, in the attack's tally and in its product's; `true` when it is final
/// for the buyer.
fn record(plan: &Plan, shelf: &Shelf, buyer: u64, twin: bool, answer: &Answer) -> bool {
    let now_us = plan.since_start_us();
    let restocked_at = shelf.restocked_at_us.load(Ordering::SeqCst);
    if answer.status == Some(201) {
        plan.orders[(buyer - 1) as usize].fetch_add(1, Ordering::SeqCst);
    }
    let mut final_answer = false;
    for tally in [&plan.tally, &shelf.tally] {
        final_answer = count(tally, buyer, twin, answer, restocked_at, now_us);
    }
    final_answer
}

/// Count one answer in `tally`, given when the buyer's product was last restocked and when
/// the answer came (µs since the start); `true` when it is final for the buyer.
fn count(
    tally: &Tally,
    buyer: u64,
    twin: bool,
    answer: &Answer,
    restocked_at_us: u64,
    now_us: u64,
) -> bool {
    let micros = answer.elapsed.as_micros() as u64;
    tally.latencies_us.lock().unwrap().push(micros);
    let lost = || tally.lost_answers.lock().unwrap().push(buyer);
    match (answer.status, answer.code.as_str()) {
        (Some(201), _) => {
            tally.created.fetch_add(1, Ordering::Relaxed);
            tally.created_latencies_us.lock().unwrap().push(micros);
            tally.created_at_us.lock().unwrap().push(now_us);
            true
        }
        (Some(409), "sold_out") => {
            tally.sold_out.fetch_add(1, Ordering::Relaxed);
            if answer.sent_us >= restocked_at_us {
                tally.sold_out_after_restock.fetch_add(1, Ordering::Relaxed);
            }
            true
        }
        (Some(409), "already_purchased") => {
            tally.already_purchased.fetch_add(1, Ordering::Relaxed);
            if twin {
                tally.twin_already_purchased.fetch_add(1, Ordering::Relaxed);
            }
            true
        }
        (Some(503), "busy") => {
            tally.busy.fetch_add(1, Ordering::Relaxed);
            false
        }
        (Some(500..=599), _) => {
            tally.other_5xx.fetch_add(1, Ordering::Relaxed);
            lost();
            false
        }
        (Some(_), _) => {
            tally.other_4xx.fetch_add(1, Ordering::Relaxed);
            true
        }
        (None, _) => {
            tally.transport_errors.fetch_add(1, Ordering::Relaxed);
            lost();
            false
        }
    }
}

/// How goose's report shows an answer: `None` for the expected ones.
fn error_of(answer: &Answer) -> Option<String> {
    match (answer.status, answer.code.as_str()) {
        (Some(201), _) | (Some(409), "sold_out" | "already_purchased") => None,
        (Some(status), code) => Some(format!("{status} {code}")),
        (None, reason) => Some(format!("no answer: {reason}")),
    }
}
