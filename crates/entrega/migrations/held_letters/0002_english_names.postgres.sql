-- PostgreSQL only, after 0002_english_names.sql: its constraint names.
ALTER TABLE entrega_held_letters RENAME CONSTRAINT entrega_retenidos_pkey TO entrega_held_letters_pkey;
