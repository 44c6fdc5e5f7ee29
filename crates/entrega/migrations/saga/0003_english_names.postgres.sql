-- PostgreSQL only, after 0003_english_names.sql: its constraint names.
ALTER TABLE entrega_saga_history
    RENAME CONSTRAINT entrega_saga_historial_pkey TO entrega_saga_history_pkey;
