//! `stocksvr dlq ...` through `run_cli`: exit codes and effects (the printed tables are
//! unit-tested in `src/cli.rs`).

mod common;

use common::*;
use std::process::ExitCode;
use stocksvr_dead_letter::{list, run_cli, show, DlqAction, Filter, Status, StatusArg};
use stocksvr_pipeline::config::Secret;

#[tokio::test(flavor = "multi_thread")]
async fn cli_actions_change_what_they_say_and_exit_1_when_refused() {
    let (url, pool) = fresh_database_with_url().await;
    let pair = topic_pair().await;
    let (topic, _) = (pair.topic.clone(), pair.dlt.clone());
    for offset in 0..2 {
        let record = original(
            &topic,
            0,
            offset,
            Some(b"k"),
            Some(b"\x00\x00\x00\x00\x00v"),
        );
        send_dead_letter(&record, "line one\nline two").await;
    }
    run_processor(&pool, &topic, 2).await;
    let ids: Vec<u64> = list(&pool, &Filter::default())
        .await
        .expect("list")
        .iter()
        .map(|r| r.id)
        .collect();
    let mut settings = settings();
    settings.mysql.url = Secret::new(url);
    let run = |action: DlqAction| {
        let settings = settings.clone();
        async move {
            run_cli(&settings, action)
                .await
                .expect("no infrastructure error")
        }
    };

    let list_all = DlqAction::List {
        status: StatusArg::All,
        topic: Some(topic.clone()),
        limit: 50,
        after: None,
    };
    assert_eq!(run(list_all.clone()).await, ExitCode::SUCCESS);
    assert_eq!(run(DlqAction::Show { id: ids[0] }).await, ExitCode::SUCCESS);
    assert_eq!(
        run(DlqAction::Show { id: 999_999 }).await,
        ExitCode::FAILURE
    );

    let replay = |force| DlqAction::Replay { id: ids[0], force };
    assert_eq!(run(replay(false)).await, ExitCode::SUCCESS);
    assert_eq!(
        run(replay(false)).await,
        ExitCode::FAILURE,
        "refused without force"
    );
    assert_eq!(run(replay(true)).await, ExitCode::SUCCESS);

    let discard = |id| DlqAction::Discard {
        id,
        reason: "test".into(),
    };
    assert_eq!(run(discard(ids[1])).await, ExitCode::SUCCESS);
    assert_eq!(
        run(discard(ids[1])).await,
        ExitCode::SUCCESS,
        "already discarded"
    );
    assert_eq!(run(discard(ids[0])).await, ExitCode::FAILURE, "replayed");

    let status = |id| {
        let pool = pool.clone();
        async move {
            show(&pool, id)
                .await
                .expect("show")
                .expect("exists")
                .summary
                .status
        }
    };
    assert_eq!(status(ids[0]).await, Status::Replayed);
    assert_eq!(status(ids[1]).await, Status::Discarded);
    assert_eq!(run(list_all).await, ExitCode::SUCCESS);
}
