"""pytest plugin for zoo runs (`-p mtpcheck.mutants._noshrink`): hypothesis
without its shrink phase. A mutant's failing example is evidence enough; the
zoo does not need it minimised (shrinking a failing interleaving costs
minutes). Clause outcomes are unchanged: a failure stays a failure."""

from hypothesis import Phase, settings

settings.register_profile("mtpcheck-zoo", phases=[Phase.explicit, Phase.reuse, Phase.generate], database=None)
settings.load_profile("mtpcheck-zoo")
