"""Entry point of the Sketch&Walk explorer: `sketchwalk app` runs `streamlit run` on this file.

One file per page under pages/, shared widgets in widgets.py, figures in the figures/ package
(pure functions, one module per kind of chart).
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

HERE = Path(__file__).parent

st.set_page_config(page_title="Sketch&Walk explorer", page_icon=":material/explore:", layout="wide")

# Widget values of a page are dropped while another page shows; re-assigning them keeps the
# New run form (and the Explore choices) as the person left them.
for _key in list(st.session_state):
    if _key.startswith(("nr_", "ex_", "df_")):
        st.session_state[_key] = st.session_state[_key]

PAGES = [
    st.Page(
        HERE / "pages" / "new_run.py",
        title="New run",
        icon=":material/play_circle:",
        url_path="new",
        default=True,
    ),
    st.Page(
        HERE / "pages" / "explore.py",
        title="Explore",
        icon=":material/grid_on:",
        url_path="explore",
    ),
    st.Page(
        HERE / "pages" / "compare.py",
        title="Compare",
        icon=":material/compare:",
        url_path="compare",
    ),
    st.Page(
        HERE / "pages" / "mask_diff.py",
        title="Mask diff",
        icon=":material/difference:",
        url_path="diff",
    ),
    st.Page(HERE / "pages" / "speed.py", title="Speed", icon=":material/speed:", url_path="speed"),
    st.Page(
        HERE / "pages" / "runs.py", title="Runs", icon=":material/table_view:", url_path="runs"
    ),
    st.Page(
        HERE / "pages" / "benchmarks.py",
        title="Benchmarks",
        icon=":material/leaderboard:",
        url_path="benchmarks",
    ),
]

st.navigation(PAGES).run()
