# The jobdist site daemon (and the one-shot `python -m jobdist.setup`), for docker-compose.yml.
#   docker build -t jobdist .
#   docker run --init --rm -v $PWD/my-site.toml:/etc/jobdist/site.toml:ro jobdist
# The tests build it on a Debian base of their own (PYTHON_IMAGE, jobdist/lab/stand_in/).
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/jobdist
# The dependencies first, in a layer of their own: a change to the code reuses it.
COPY pyproject.toml README.md ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt && rm /tmp/requirements.txt
COPY jobdist ./jobdist
COPY couch_design ./couch_design
# A plain install: the design documents go into the package (jobdist.couch_design).
RUN pip install --no-deps . && rm -rf build *.egg-info

# The compose sites; mount your own directory here (or a single /etc/jobdist/site.toml).
COPY sites/compose /etc/jobdist/sites

# Steps are shell commands: never run them as root.
RUN useradd --system --uid 10001 --create-home --home-dir /home/jobdist jobdist
USER jobdist
WORKDIR /home/jobdist

# The admin endpoint ([admin] port in the site config) answers once the daemon runs.
EXPOSE 7984
HEALTHCHECK --interval=5s --timeout=5s --start-period=5s --retries=12 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:7984/status', timeout=3)"]
# The daemon ends on SIGTERM (its steps end or are released); run it with an init
# (`docker run --init`, compose's `init: true`) so the steps' orphans are reaped.
ENTRYPOINT ["jobdist", "site", "run"]
CMD ["--config", "/etc/jobdist/site.toml"]
