"""pytgi.runtime: puts the engine together with its workers (`build_engine_core`) and runs it in
this thread for the offline API (`LLM`). It sits above the engine and the workers, so the engine
never imports the code that executes its steps."""
