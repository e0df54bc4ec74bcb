"""Where a run's slots run: ``site`` (the ``Site`` the run asks, chosen by
``open_site``), ``local`` (this machine: slots as threads) and ``ray`` (the nodes of a
Ray cluster, imported only for ``run --ray``)."""
