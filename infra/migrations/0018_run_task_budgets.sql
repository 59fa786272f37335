-- Task budgets declared once per run: the run's first event may carry a TaskBudget
-- (envelope field ``task_budget``); it is kept with the run so a restart or another assembler
-- replica applies the same budget. NULL: the run declared none (a prepare may still bring one).
ALTER TABLE ctx.runs ADD COLUMN task_budget jsonb;
