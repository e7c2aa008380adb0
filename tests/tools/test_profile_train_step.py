"""tools/profile_train_step.py: a row per part of the iteration, times that add up."""
from tools import profile_train_step


def test_profile_table_of_the_demo_model(synthetic_nuscenes, tools_cli, tmp_path, capsys):
    config = str(tmp_path / 'demo.py')
    tools_cli.tiny_config(synthetic_nuscenes, base='demo/cmt_aqr_synthetic_tiny.py', slim=True).dump(config)
    means = profile_train_step.main([config, '--iters', '2', '--warmup', '1', '--workers', '0'])
    table = capsys.readouterr().out
    for row in ('| data |', '| img_backbone |', '| pts_voxel_encoder |', '| head |', '|   AQR weight generator |',
                '|   transformer |', '| loss (matching included) |', '|   assigner |', '| backward |',
                '| iteration |'):
        assert row in table, row
    assert 0 < means['head'] < means['forward'] < means['iteration']
    assert means['data'] + means['forward'] + means['backward'] + means['optimizer step'] <= means['iteration'] * 1.01
