-- The Curio HarmonyDB tables Warden reads, as they stand after all of Curio's migrations
-- (Curio's own migrations: filecoin-project/curio harmony/harmonydb/sql, HEAD 2026-08; docs/curio.md).
-- Run with search_path set to the schema to create them in (Curio uses schema "curio").
-- Foreign keys to tables Warden never reads (sectors_meta) are left out; every column is kept.

CREATE TABLE harmony_machines (
    id SERIAL PRIMARY KEY NOT NULL,
    last_contact TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP,
    host_and_port varchar(300) NOT NULL,
    cpu INTEGER NOT NULL,
    ram BIGINT NOT NULL,
    gpu FLOAT NOT NULL,
    unschedulable BOOLEAN DEFAULT FALSE,          -- 20250111-machine-maintenance
    restart_request TIMESTAMPTZ                   -- 20250818-restart-request
);

CREATE TABLE harmony_machine_details (
    id SERIAL PRIMARY KEY,
    tasks TEXT NOT NULL,
    layers TEXT NOT NULL,
    startup_time TIMESTAMPTZ NOT NULL,
    miners TEXT NOT NULL,
    machine_id INTEGER,
    machine_name TEXT NOT NULL DEFAULT '',        -- 20240527-machine_name
    version TEXT NOT NULL DEFAULT '',             -- 20260501
    FOREIGN KEY (machine_id) REFERENCES harmony_machines (id) ON DELETE CASCADE
);
CREATE UNIQUE INDEX machine_details_machine_id ON harmony_machine_details (machine_id);

CREATE TABLE harmony_task (
    id SERIAL PRIMARY KEY NOT NULL,
    initiated_by INTEGER,
    update_time TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP,
    posted_time TIMESTAMPTZ NOT NULL,
    owner_id INTEGER REFERENCES harmony_machines (id) ON DELETE SET NULL,
    added_by INTEGER NOT NULL,
    previous_task INTEGER,
    name varchar(16) NOT NULL,
    retries BIGINT NOT NULL DEFAULT 0             -- 20240927-task-retrywait
);
CREATE INDEX idx_harmony_task_unowned_by_name ON harmony_task (name, update_time) WHERE owner_id IS NULL;

CREATE TABLE harmony_task_history (
    id SERIAL PRIMARY KEY NOT NULL,
    task_id INTEGER NOT NULL,
    name VARCHAR(16) NOT NULL,
    posted TIMESTAMPTZ NOT NULL,
    work_start TIMESTAMPTZ NOT NULL,
    work_end TIMESTAMPTZ NOT NULL,
    result BOOLEAN NOT NULL,
    err varchar,
    completed_by_host_and_port varchar(300) NOT NULL
);
CREATE INDEX harmony_task_history_task_id_result_index ON harmony_task_history (task_id, result);
CREATE INDEX harmony_task_history_work_index ON harmony_task_history (work_end DESC, name, task_id, result);

CREATE TABLE sectors_sdr_pipeline (
    sp_id BIGINT NOT NULL,
    sector_number BIGINT NOT NULL,
    create_time TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP,
    reg_seal_proof INT NOT NULL,
    user_sector_duration_epochs BIGINT DEFAULT NULL,
    ticket_epoch BIGINT,
    ticket_value BYTEA,
    task_id_sdr BIGINT,
    after_sdr BOOL NOT NULL DEFAULT FALSE,
    tree_d_cid TEXT,
    task_id_tree_d BIGINT,
    after_tree_d BOOL NOT NULL DEFAULT FALSE,
    task_id_tree_c BIGINT,
    after_tree_c BOOL NOT NULL DEFAULT FALSE,
    tree_r_cid TEXT,
    task_id_tree_r BIGINT,
    after_tree_r BOOL NOT NULL DEFAULT FALSE,
    task_id_synth BIGINT,
    after_synth BOOL NOT NULL DEFAULT FALSE,
    precommit_ready_at TIMESTAMPTZ,
    precommit_msg_cid TEXT,
    task_id_precommit_msg BIGINT,
    after_precommit_msg BOOL NOT NULL DEFAULT FALSE,
    seed_epoch BIGINT,
    precommit_msg_tsk BYTEA,
    after_precommit_msg_success BOOL NOT NULL DEFAULT FALSE,
    seed_value BYTEA,
    task_id_porep BIGINT,
    porep_proof BYTEA,
    after_porep BOOL NOT NULL DEFAULT FALSE,
    task_id_finalize BIGINT,
    after_finalize BOOL NOT NULL DEFAULT FALSE,
    task_id_move_storage BIGINT,
    after_move_storage BOOL NOT NULL DEFAULT FALSE,
    commit_ready_at TIMESTAMPTZ,
    commit_msg_cid TEXT,
    task_id_commit_msg BIGINT,
    after_commit_msg BOOL NOT NULL DEFAULT FALSE,
    commit_msg_tsk BYTEA,
    after_commit_msg_success BOOL NOT NULL DEFAULT FALSE,
    failed BOOL NOT NULL DEFAULT FALSE,
    failed_at TIMESTAMPTZ,
    failed_reason VARCHAR(20) NOT NULL DEFAULT '',
    failed_reason_msg TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (sp_id, sector_number)
);

CREATE TABLE sectors_snap_pipeline (
    sp_id BIGINT NOT NULL,
    sector_number BIGINT NOT NULL,
    start_time TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP,
    upgrade_proof INT NOT NULL,
    data_assigned BOOLEAN NOT NULL DEFAULT TRUE,
    update_unsealed_cid TEXT,
    update_sealed_cid TEXT,
    task_id_encode BIGINT,
    after_encode BOOLEAN NOT NULL DEFAULT FALSE,
    proof BYTEA,
    task_id_prove BIGINT,
    after_prove BOOLEAN NOT NULL DEFAULT FALSE,
    task_id_submit BIGINT,
    after_submit BOOLEAN NOT NULL DEFAULT FALSE,
    task_id_move_storage BIGINT,
    after_move_storage BOOLEAN NOT NULL DEFAULT FALSE,
    failed BOOLEAN NOT NULL DEFAULT FALSE,        -- 20240809-snap-failures
    failed_at TIMESTAMPTZ,
    failed_reason VARCHAR(20) NOT NULL DEFAULT '',
    failed_reason_msg TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (sp_id, sector_number)
);
