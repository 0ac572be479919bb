"""Floor 7, the pages the code writes: the lab report's front page (:mod:`.report`), the
findings table and every other generated block of the manual (:mod:`.findings`), the
reference of every option and command (:mod:`.reference`), and the checks every figure of an
executed notebook passes (:mod:`.figcheck`). ``python -m labkit docs`` writes them; a test
fails when one is stale."""
