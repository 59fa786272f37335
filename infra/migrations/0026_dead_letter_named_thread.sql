-- An event published on one thread's subject while its body names another is dead-lettered under the
-- subject's thread; the runtime may be waiting on the body's thread for that key. The body's thread is
-- kept too, so a prepare on either thread naming the key hears event_rejected at once instead of
-- waiting out its wait_ms. Only such rows have one: the index holds nothing else.
ALTER TABLE ctx.dead_letters ADD COLUMN named_thread_id text;
CREATE INDEX dead_letters_named_event ON ctx.dead_letters (named_thread_id, event_key)
WHERE named_thread_id IS NOT NULL;
