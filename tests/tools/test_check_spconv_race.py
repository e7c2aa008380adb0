"""tools/check_spconv_race.py: the table it prints and its verdict on the patched scatter-add."""
import json

from projects.mmdet3d_plugin.diagnostics import spconv_race_check
from projects.mmdet3d_plugin.mmcv_custom.sparse_conv_check import spconv_openmp_threads
from tools import check_spconv_race


def test_patched_scatter_passes_and_the_table_counts_every_layer(tmp_path, capsys):
    out = tmp_path / 'race.json'
    code = check_spconv_race.main(['--configs', 'configs/cmt_voxel0100_r50_800x320_cbgs.py', '--runs', '2',
                                   '--threads', '2', '--load', '1', '--scatter', 'patched', '--grid', '48',
                                   '--sites', '1500', '--out', str(out)])
    assert code == 0
    table = capsys.readouterr().out
    assert '| cmt_voxel0100_r50_800x320_cbgs.py | 2 | patched | 2 | 0 |' in table
    [result] = json.loads(out.read_text())
    assert result['threads'] == 2 and result['load'] == 1 and result['sparse_shape'] == [41, 48, 48]
    # what spconv's OpenMP runtime reports in the worker; None on its builds without OpenMP (the CUDA wheels)
    assert result['omp_threads'] == (None if spconv_openmp_threads() is None else 2)
    # the r50 encoder: 3 strided SparseConv3d + 1 output conv, the rest submanifold; each checked in both runs
    assert result['per_type']['SparseConv3d']['checked'] == 2 * 4
    assert result['per_type']['SubMConv3d']['checked'] >= 2 * 8
    assert result['bit_identical']


def test_a_wrong_patched_result_fails(monkeypatch, capsys):
    def wrong(encoder, features, coords, runs):
        return dict(runs=runs, bad_runs=1, per_type={'SubMConv3d': dict(checked=1, wrong=1)}, worst_rel_err=0.3,
                    bit_identical=False)

    monkeypatch.setattr(spconv_race_check, 'check_encoder', wrong)
    results = [dict(wrong(None, None, None, 1), config='c.py', threads=2, scatter='patched', seconds=0.0,
                    sparse_shape=[41, 8, 8])]
    monkeypatch.setattr(spconv_race_check, 'run_thread_count', lambda options, threads: results)
    assert check_spconv_race.main(['--configs', 'configs/cmt_voxel0100_r50_800x320_cbgs.py', '--load', '0',
                                   '--threads', '2']) == 1
    assert 'FAILED: patched scatter' in capsys.readouterr().err
